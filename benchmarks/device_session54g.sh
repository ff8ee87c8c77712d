#!/usr/bin/env bash
# For the session after the fifty-first (written then; its device time ran out before a
# machine started): call 217's Nsight Compute profile of the one-pass output layer put a
# fifth of its samples on the cluster barrier's release fence and wait. _cuda_tc_head's
# SPLIT_BARRIER splits that barrier in two (arrive right after the next tile's push, wait
# at the next step's start, each tile's gradients between them). Its GPU tests with the
# split (and the default's), the kernel alone (whole and split barrier) against the two
# kernels, and the compiled 16-bit large steps: head off, on, on with the split (three
# rounds). Results: $OUT/results-$TAG.tgz.
set -uo pipefail
TAG=${TAG:-s54g}
source "$(dirname "$0")/_device_lib.sh"
FUSEFLOW_TC_HEAD_SPLIT_BARRIER=1 TAILN=25 run pytest_tc_head_split 200 python3 -m pytest -m gpu \
  -q -rfE -p no:cacheprovider tests/test_gpu_tc_head.py
TAILN=12 run tc_head_sweep 60 python3 benchmarks/tc_head_sweep.py --out "$res" --tag "$TAG" \
  --clusters 14,15 --tiles 32x3,32x4 --split-barrier
ab tc_head 240 3 fused_tc_head=0 fused_tc_head=1 "fused_tc_head=1,_cuda_tc_head.SPLIT_BARRIER=True"
