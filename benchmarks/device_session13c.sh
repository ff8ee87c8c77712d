#!/usr/bin/env bash
# The tenth session's third call: the own full-float32 matmul at more blocks per SM than
# the earlier sweep tried (64 x 64 and 32 x 64 tiles, of 2 and 1 warps, with up to 12 K
# splits), at the medium model's five matmuls; then the layer GPU tests after the int
# in_shape change. Results: $OUT/results-s13c.tgz.
set -uo pipefail
TAG=s13c
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run gemm_sweep_small_tiles 300 python3 benchmarks/gemm_sweep.py --out "$res" \
  --name gemm_sweep_small_tiles --warps 2x1,1x1,2x2,1x2 --splits 1,2,3,4,6,8,12 --bk 16 --layers 5
TAILN=6 run pytest_gpu_layers 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests -k "dense or layernorm or layer or serial"
