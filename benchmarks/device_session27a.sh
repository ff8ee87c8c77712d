#!/usr/bin/env bash
# Twenty-fourth session, call 115 (run on commit 2747476, where the settings exist): the side
# stream's split update on a capped grid (side_update_blocks_per_sm), waiting for the whole
# input gradient or only its matmul (update_after_product), side by side in the compiled
# medium steps (5 alternating rounds), then the split update's GPU tests.
# Results: $OUT/results-s27a.tgz.
set -uo pipefail
TAG=s27a
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run ab_side_grid 200 python3 benchmarks/settings_ab.py --out "$res" --name side_grid --rounds 5 \
  --setting update_after_product=False,side_update_blocks_per_sm=0 \
  --setting update_after_product=False,side_update_blocks_per_sm=1 \
  --setting update_after_product=False,side_update_blocks_per_sm=2 \
  --setting update_after_product=False,side_update_blocks_per_sm=4 \
  --setting update_after_product=True,side_update_blocks_per_sm=1 \
  --setting update_after_product=True,side_update_blocks_per_sm=2 \
  --config 784-1024-1024-10:sgd:fp32 --config 784-1024-1024-10:adam:fp32
TAILN=10 run pytest_split 120 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_split_update.py
