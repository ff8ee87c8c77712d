#!/usr/bin/env bash
# Fifty-second session, for a short call (about five minutes of device time left): the
# one-pass output layer's GPU tests in its three forms, then the kernel alone in each
# (device_session55b.sh without its step timings). Call 218 ran it at commit c0f2194, when
# tc_head_sweep.py took --split-barrier --roles for what --forms whole,split,roles times
# now. Results: $OUT/results-$TAG.tgz.
set -uo pipefail
TAG=${TAG:-s55c}
source "$(dirname "$0")/_device_lib.sh"
TAILN=25 run pytest_tc_head 170 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  $(xdist load 4) tests/test_gpu_tc_head.py
TAILN=12 run tc_head_sweep 70 python3 benchmarks/tc_head_sweep.py --out "$res" --tag "$TAG" \
  --clusters 14 --tiles 32x3,32x4 --forms whole,split,roles
