#!/usr/bin/env bash
# Twenty-third session, call 114: the side stream's launch of the split update on a capped
# grid (side_update_blocks_per_sm), with the update waiting for the whole input gradient
# or only its matmul (update_after_product); calls 112-113 found the full grid's blocks
# holding the SMs before layer 1's weight gradient. Tests of the split update, then the
# settings side by side in the compiled medium steps. Results: $OUT/results-s26c.tgz.
set -uo pipefail
TAG=s26c
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run tests_split 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider $(xdist load) \
  tests/test_split_update.py tests/test_fused_optim.py
TAILN=12 run ab_side_grid 300 python3 benchmarks/settings_ab.py --out "$res" --name side_grid --rounds 5 \
  --setting update_after_product=False,side_update_blocks_per_sm=0 \
  --setting update_after_product=False,side_update_blocks_per_sm=1 \
  --setting update_after_product=False,side_update_blocks_per_sm=2 \
  --setting update_after_product=True,side_update_blocks_per_sm=1 \
  --setting update_after_product=True,side_update_blocks_per_sm=2 \
  --setting update_after_product=True,side_update_blocks_per_sm=4 \
  --config 784-1024-1024-10:sgd:fp32 --config 784-1024-1024-10:adam:fp32
