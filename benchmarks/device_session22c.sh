#!/usr/bin/env bash
# Nineteenth session, call 100: the overlap order "early" (each weight gradient forked
# before its layer's input gradient, the lowest layer's on the main stream) with the split
# update waiting for the last input gradient; its tests, timelines under "early", and the
# orders and split settings side by side. Results: $OUT/results-s22c.tgz.
set -uo pipefail
TAG=s22c
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_split 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_split_update.py tests/test_overlap.py tests/test_fused_head.py tests/test_compile.py
FUSEFLOW_OVERLAP_ORDER=early TAILN=3 run profile_early 60 python3 benchmarks/profile_step.py \
  --framework fuseflow --out "$res" --tag "${TAG}_early" \
  --configs "784-1024-1024-10:adam:fp32,784-1024-1024-10:sgd:fp32"
TAILN=6 run split_probe 150 python3 benchmarks/split_update_probe.py --out "$res" --rounds 4
