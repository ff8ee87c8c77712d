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
wgmma_splits_steps 60 90 40 80
export FUSEFLOW_FP32_WGMMA=3xtf32-lotrunc
echo "gpu_groups, cli_runs: FUSEFLOW_FP32_WGMMA=$FUSEFLOW_FP32_WGMMA" >> "$res/env.txt"
gpu_groups 200 110
cli_runs 30
unset FUSEFLOW_FP32_WGMMA
TAILN=3 run wgmma_splits 60 python3 benchmarks/wgmma_splits.py --out "$res" --seeds 3
