#!/usr/bin/env bash
# Forty-sixth session's one call, cut to the device time left after failed starts: 49a and
# 49b's steps by priority, so that a time limit cuts the least needed. The kernel's GPU
# tests (every split, "3xtf32-lotrunc" for the first time); the compiled medium fp32
# steps off / rounded / lotrunc / chopped side by side (settings_ab.py, three rounds);
# paired time to 98% (--mnist-start shared, 20 seeds) for fuseflow lotrunc, fuseflow
# rounded and JAX; every GPU test with lotrunc as the split (call 158's two groups); the
# CLI; each split's error and kernel time per medium product (wgmma_splits.py).
# Results: $OUT/results-s49c.tgz.
set -uo pipefail
TAG=${TAG:-s49c}
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run pytest_wgmma 60 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_wgmma.py
TAILN=4 run ab_splits 90 python3 benchmarks/settings_ab.py --out "$res" --name splits_medium \
  --setting fp32_wgmma=off --setting fp32_wgmma=3xtf32 --setting fp32_wgmma=3xtf32-lotrunc \
  --setting fp32_wgmma=3xtf32-chop \
  --config 784-1024-1024-10:sgd:fp32 --config 784-1024-1024-10:adam:fp32 --rounds 3
for split in 3xtf32-lotrunc 3xtf32; do
  FUSEFLOW_FP32_WGMMA=$split paired98 "peers_fuseflow_$split" 40 fuseflow "${TAG}_$split"
done
paired98 peers_jax_shared 80 jax "${TAG}_jax"
export FUSEFLOW_FP32_WGMMA=3xtf32-lotrunc
echo "gpu_groups, cli_runs: FUSEFLOW_FP32_WGMMA=$FUSEFLOW_FP32_WGMMA" >> "$res/env.txt"
gpu_groups 200 110
cli_runs 30
unset FUSEFLOW_FP32_WGMMA
TAILN=3 run wgmma_splits 60 python3 benchmarks/wgmma_splits.py --out "$res" --seeds 3
