#!/usr/bin/env bash
# Thirty-fourth session: the split update's test with compute_copy's bfloat16 gradients
# (weight gradients forked by request), the overlap's tests, then the large bfloat16 step
# without loss scaling (compute_copy: the split update may be taken) with its weight
# gradients forked to the side streams (overlap_wgrad=1; "auto" forks full float32 only)
# against the default, four alternating rounds (settings_ab.py).
# Results: $OUT/results-s37b2.tgz.
set -uo pipefail
TAG=s37b2
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu_split 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_split_update.py tests/test_overlap.py
TAILN=8 run ab_overlap_bf16 300 python3 benchmarks/settings_ab.py --out "$res" \
  --name overlap_bf16 --loss-scaling none --rounds 4 \
  --setting overlap_wgrad=auto --setting overlap_wgrad=1 \
  --setting overlap_wgrad=1,overlap_order=after --setting overlap_wgrad=1,split_update=0
