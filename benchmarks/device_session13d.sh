#!/usr/bin/env bash
# The tenth session's fourth call: the own full-float32 matmul with its K splits added in a
# thread-block cluster (distributed shared memory) instead of by the last-arriving block,
# swept against the last-block finish and cuBLASLt at the medium model's five matmuls; then
# the own kernel's GPU tests, cluster launches included. Results: $OUT/results-s13d.tgz.
set -uo pipefail
TAG=s13d
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run gemm_sweep_cluster 240 python3 benchmarks/gemm_sweep.py --out "$res" \
  --name gemm_sweep_cluster --warps 2x2,2x1,1x2,1x1 --splits 2,3,4,6,8 --bk 16 --layers 5 --cluster both
TAILN=10 run pytest_own_gemm 240 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider -x tests/test_own_gemm.py
