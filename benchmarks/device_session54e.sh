#!/usr/bin/env bash
# Fifty-first session, third GPU run of the one-pass output layer, after its per-tile waits
# were cut (the relu_aux bytes copied asynchronously with the tiles, the bias and loss scale
# read once, each tile's labels a step ahead): its GPU tests, the kernel alone against the
# two kernels (13-15 clusters, two tile shapes), the compiled 16-bit large steps with it
# off and on (settings_ab.py, three rounds); with it on, an interleaved_16bit.py process
# and a peers.py 16-bit pair. Results: $OUT/results-$TAG.tgz.
set -uo pipefail
TAG=${TAG:-s54e}
source "$(dirname "$0")/_device_lib.sh"
TAILN=25 run pytest_tc_head 240 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_gpu_tc_head.py
TAILN=12 run tc_head_sweep 60 python3 benchmarks/tc_head_sweep.py --out "$res" --tag "$TAG" \
  --clusters 13,14,15 --tiles 32x3,32x4
ab tc_head 240 3 fused_tc_head=0 fused_tc_head=1
FUSEFLOW_FUSED_TC_HEAD=1 interleaved_16bit interleaved_head 150 --tag "${TAG}_head" \
  --rounds 3 --window 1.5
FUSEFLOW_FUSED_TC_HEAD=1 pair_16bit 45
