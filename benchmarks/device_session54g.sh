#!/usr/bin/env bash
# Fifty-first session, after call 217's Nsight Compute profile of the one-pass output layer
# (a fifth of its samples on the cluster barrier's release fence and wait): the barrier
# split in two, its arrive right after the next tile's push and its wait at the next
# step's start, so each tile's gradients run while it completes (dy in two buffers, the
# mask bytes in three). Its GPU tests, the kernel alone against the two kernels, and the
# compiled 16-bit large steps with it off and on (three rounds). Results:
# $OUT/results-$TAG.tgz.
set -uo pipefail
TAG=${TAG:-s54g}
source "$(dirname "$0")/_device_lib.sh"
TAILN=25 run pytest_tc_head 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_gpu_tc_head.py
TAILN=12 run tc_head_sweep 60 python3 benchmarks/tc_head_sweep.py --out "$res" --tag "$TAG" \
  --clusters 14,15 --tiles 32x3,32x4
ab tc_head 200 3 fused_tc_head=0 fused_tc_head=1
