#!/usr/bin/env bash
# The tenth session's sixth call: the own full-float32 matmul with its operand loads
# planned once before the main loop (pointers advanced per k-tile, predicated loads, no
# per-tile index arithmetic or branches), its GPU tests, and the sweep against cuBLASLt at
# the medium model's five matmuls. Results: $OUT/results-s13f.tgz.
set -uo pipefail
TAG=s13f
source "$(dirname "$0")/_device_lib.sh"
TAILN=6 run pytest_own_gemm 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider -x tests/test_own_gemm.py
TAILN=8 run gemm_sweep_loader 150 python3 benchmarks/gemm_sweep.py --out "$res" \
  --name gemm_sweep_loader --warps 2x2,2x1 --splits 1,2,3,4,6,8 --bk 16 --layers 5 --cluster both
