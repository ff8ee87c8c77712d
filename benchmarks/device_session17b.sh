#!/usr/bin/env bash
# The fourteenth session's second call: the own matmul's float64 tensor-core form on
# Hopper's mma.m16n8k{4,8,16} (call 64 measured Ampere's m8n8k4 at half their rate). Its
# tests, the per-layer sweep against the cuBLASLt path (medium model's five matmuls), and
# the compiled medium steps with it on against the default, alternating. Results:
# $OUT/results-s17b.tgz.
set -uo pipefail
TAG=s17b
source "$(dirname "$0")/_device_lib.sh"
TAILN=15 run pytest_f64 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_own_gemm.py -k "f64"
TAILN=8 run gemm_sweep_dmma 240 python3 benchmarks/gemm_sweep.py --out "$res" --name gemm_sweep_dmma \
  --layers 5 --mma f64 --dmma-k 4,8,16 --warps 2x2,1x2,2x1,1x1 --splits 1,2,4,8 --bk 16 --cluster both
profile_f64_ab 784-1024-1024-10:sgd:fp32,784-1024-1024-10:adam:fp32
