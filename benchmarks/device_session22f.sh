#!/usr/bin/env bash
# Nineteenth session, call 103, the review fixes of the split update (counters stored by
# the main stream's launch only, non-Dense layers' backward counted as reads, the capture
# id checked): their tests, then the settings side by side once more (2 rounds).
# Results: $OUT/results-s22f.tgz.
set -uo pipefail
TAG=s22f
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_split 125 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_split_update.py tests/test_overlap.py tests/test_fused_optim.py tests/test_compile.py
TAILN=6 run split_probe 40 python3 benchmarks/split_update_probe.py --out "$res" --rounds 2
