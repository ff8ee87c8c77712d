#!/usr/bin/env bash
# The fifteenth session's second call: the own matmul's float64 form with its tiles in
# float64 shared memory (converted once when staged, fragments in 16-byte loads; call 65's
# Nsight Compute profile had its warps stalled on the per-fragment conversions). Its
# tests (the whole own-matmul file: the staging is shared with the float32 form), the
# per-layer sweep, the compiled medium steps against the cuBLASLt path (alternating), and
# its Nsight Compute profile. Results: $OUT/results-s18b.tgz.
set -uo pipefail
TAG=s18b
source "$(dirname "$0")/_device_lib.sh"
TAILN=15 run pytest_own_gemm 240 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_own_gemm.py
TAILN=8 run gemm_sweep_f64smem 200 python3 benchmarks/gemm_sweep.py --out "$res" --name gemm_sweep_f64smem \
  --layers 5 --mma f64 --dmma-k 16 --warps 2x2,2x1,4x2,1x2 --splits 1,2,4,8 --bk 16,32 --cluster both
profile_f64_ab 784-1024-1024-10:sgd:fp32,784-1024-1024-10:adam:fp32
TAILN=4 run ncu_f64smem 120 ncu --clock-control none --profile-from-start off -k regex:simt_gemm \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
  --section SourceCounters --section Occupancy --section LaunchStats --print-details all \
  python3 benchmarks/gemm_pair.py --mma f64
