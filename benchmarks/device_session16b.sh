#!/usr/bin/env bash
# The thirteenth session's second call: the own matmul on the float64 tensor cores
# (_cuda_gemm mma="f64": float32 operands, products exact in float64, rounded once). Its
# tests, the per-layer sweep against the cuBLASLt path (medium model's five matmuls), and
# the compiled medium steps with it on against the default, alternating. Results:
# $OUT/results-s16b.tgz.
set -uo pipefail
TAG=s16b
source "$(dirname "$0")/_device_lib.sh"
TAILN=15 run pytest_f64 120 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_own_gemm.py -k "f64"
TAILN=8 run gemm_sweep_f64 200 python3 benchmarks/gemm_sweep.py --out "$res" --name gemm_sweep_f64 \
  --layers 5 --mma f64 --warps 2x2,1x2,2x1,1x1 --splits 1,2,4,8 --bk 16 --cluster both
CONFIGS=784-1024-1024-10:sgd:fp32,784-1024-1024-10:adam:fp32
for v in cublas f64 cublas f64; do
  if [ $v = f64 ]; then export FUSEFLOW_OWN_GEMM_MAX_MACS=1099511627776 FUSEFLOW_OWN_GEMM_MMA=f64
  else unset FUSEFLOW_OWN_GEMM_MAX_MACS FUSEFLOW_OWN_GEMM_MMA; fi
  TAILN=3 run "profile_$v" 60 python3 benchmarks/profile_step.py --framework fuseflow \
    --out "$res" --tag "s16b_$v" --configs "$CONFIGS"
  mv "$res/profile_fuseflow_s16b_$v.json" "$res/profile_fuseflow_s16b_${v}_$SECONDS.json"
done
