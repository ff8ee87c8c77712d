#!/usr/bin/env bash
# Forty-second session: the 3xTF32 wgmma matmul in the backend (fuseflow/backend/_cuda_wgmma.py,
# CudaBackend.fp32_wgmma, opt-in). Its GPU tests; the compiled medium fp32 steps with it
# off / rounded split / chopped split side by side (settings_ab.py, two rounds); then, as far
# as the call's time goes (about 250 s of device time were left), peers.py's JAX worker on
# the medium fp32 steps and fuseflow's with the rounded split on (step times and time to 98%
# over 5 paired seeds).
# Results: $OUT/results-s45b.tgz.
set -uo pipefail
TAG=${TAG:-s45b}
source "$(dirname "$0")/_device_lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$res/env.txt" 2>&1
TAILN=15 run pytest_wgmma 80 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_wgmma.py
TAILN=12 run ab_wgmma 90 python3 benchmarks/settings_ab.py --out "$res" --name wgmma_medium \
  --setting fp32_wgmma=off --setting fp32_wgmma=3xtf32 --setting fp32_wgmma=3xtf32-chop \
  --config 784-1024-1024-10:sgd:fp32 --config 784-1024-1024-10:adam:fp32 --rounds 2
TAILN=4 peers peers_jax 60 --worker jax --tag "$TAG" --models 784-1024-1024-10 \
  --precisions fp32 --no-mnist
FUSEFLOW_FP32_WGMMA=3xtf32 TAILN=4 peers peers_fuseflow_wgmma 110 --worker fuseflow \
  --tag "${TAG}_wgmma" --models 784-1024-1024-10 --precisions fp32 --mnist-seeds 5
