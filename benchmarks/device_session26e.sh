#!/usr/bin/env bash
# Twenty-third session, not run (no device was lent): the side stream's split update on a
# capped grid (side_update_blocks_per_sm), with the update waiting for the whole input
# gradient or only its matmul (update_after_product), side by side in the compiled medium
# steps (3 rounds), then every GPU test. The settings exist only in commit 2747476 (backed
# out of main): check that commit out first. Results: $OUT/results-s26e.tgz.
set -uo pipefail
TAG=s26e
source "$(dirname "$0")/_device_lib.sh"
TAILN=6 run ab_side_grid 90 python3 benchmarks/settings_ab.py --out "$res" --name side_grid --rounds 3 \
  --setting update_after_product=False,side_update_blocks_per_sm=0 \
  --setting update_after_product=False,side_update_blocks_per_sm=1 \
  --setting update_after_product=False,side_update_blocks_per_sm=2 \
  --setting update_after_product=True,side_update_blocks_per_sm=1 \
  --setting update_after_product=True,side_update_blocks_per_sm=2 \
  --config 784-1024-1024-10:sgd:fp32 --config 784-1024-1024-10:adam:fp32
TAILN=25 run pytest_gpu_all 240 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  $(xdist load) tests --ignore=tests/test_kernel_sources.py
