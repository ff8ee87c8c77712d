#!/usr/bin/env bash
# Nineteenth session, call 101: two side streams taken in turn (the output layer's short
# weight gradient no longer holds up the next one), with the orders "after" and "early" and
# the split update: tests, a timeline, the settings side by side. Results: results-s22d.tgz.
set -uo pipefail
TAG=s22d
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_split 170 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_split_update.py tests/test_overlap.py tests/test_fused_head.py tests/test_compile.py
FUSEFLOW_OVERLAP_ORDER=early FUSEFLOW_OVERLAP_STREAMS=2 TAILN=3 run profile_early2 60 \
  python3 benchmarks/profile_step.py --framework fuseflow --out "$res" --tag "${TAG}_early2" \
  --configs "784-1024-1024-10:adam:fp32,784-1024-1024-10:sgd:fp32"
TAILN=6 run split_probe 150 python3 benchmarks/split_update_probe.py --out "$res" --rounds 4
