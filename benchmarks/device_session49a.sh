#!/usr/bin/env bash
# Forty-fifth session's script for the next call (not run there: 234 s of device time were
# left, under what a start needs): the "3xtf32-lotrunc" split (hi rounded, lo truncated by
# the tensor cores; three instructions a value against the rounded split's five, the same
# error in tests/test_wgmma.py's model). The kernel's GPU tests (every split), each
# split's error and time at the five medium products beside cuBLASLt's float32 and TF32
# (wgmma_splits.py), the compiled medium fp32 steps off / rounded / lotrunc / chopped
# side by side (settings_ab.py, three rounds), then paired time to 98% (--mnist-start
# shared, 20 seeds): fuseflow lotrunc, fuseflow default, JAX. Worst case 530 s; results
# come back step by step. Results: $OUT/results-s49a.tgz.
set -uo pipefail
TAG=${TAG:-s49a}
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run pytest_wgmma 100 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_wgmma.py
TAILN=3 run wgmma_splits 90 python3 benchmarks/wgmma_splits.py --out "$res" --seeds 3
TAILN=4 run ab_splits 140 python3 benchmarks/settings_ab.py --out "$res" --name splits_medium \
  --setting fp32_wgmma=off --setting fp32_wgmma=3xtf32 --setting fp32_wgmma=3xtf32-lotrunc \
  --setting fp32_wgmma=3xtf32-chop \
  --config 784-1024-1024-10:sgd:fp32 --config 784-1024-1024-10:adam:fp32 --rounds 3
for split in 3xtf32-lotrunc 3xtf32; do
  FUSEFLOW_FP32_WGMMA=$split paired98 "peers_fuseflow_$split" 50 fuseflow "${TAG}_$split"
done
paired98 peers_jax_shared 100 jax "${TAG}_jax"
