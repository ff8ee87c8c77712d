#!/usr/bin/env bash
# Forty-fifth session's script for the next call (not run there: 234 s of device time were
# left, under what a start needs): the "3xtf32-lotrunc" split (hi rounded, lo truncated by
# the tensor cores; three instructions a value against the rounded split's five, the same
# error in tests/test_wgmma.py's model). The kernel's GPU tests (every split), the
# compiled medium fp32 steps off / rounded / lotrunc / chopped side by side (settings_ab.py,
# three rounds), paired time to 98% (--mnist-start shared, 20 seeds): fuseflow lotrunc,
# fuseflow default, JAX; then each split's error and time at the five medium products
# beside cuBLASLt's float32 and TF32 (wgmma_splits.py). Worst case 530 s; results
# come back step by step. Results: $OUT/results-s49a.tgz.
set -uo pipefail
TAG=${TAG:-s49a}
source "$(dirname "$0")/_device_lib.sh"
wgmma_splits_steps 100 140 50 100
TAILN=3 run wgmma_splits 90 python3 benchmarks/wgmma_splits.py --out "$res" --seeds 3
