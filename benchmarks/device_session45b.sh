#!/usr/bin/env bash
# Forty-second session (not run there: no device time left; the next session's first call):
# the 3xTF32 wgmma matmul in the backend (fuseflow/backend/_cuda_wgmma.py,
# CudaBackend.fp32_wgmma, opt-in). Its GPU tests and the compiled-step tests that now share
# check_compiled_matches_eager; the compiled medium fp32 steps with it off / rounded split /
# chopped split side by side (settings_ab.py, three rounds); then peers.py's JAX worker and
# fuseflow's with the kernel rounded, chopped and off (medium model, fp32: step times and
# time to 98% over 10 paired seeds), one process each.
# Results: $OUT/results-s45b.tgz.
set -uo pipefail
TAG=${TAG:-s45b}
source "$(dirname "$0")/_device_lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$res/env.txt" 2>&1
TAILN=15 run pytest_wgmma 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_wgmma.py tests/test_own_gemm.py tests/test_compile.py -k "wgmma or compiled_step"
TAILN=12 run ab_wgmma 150 python3 benchmarks/settings_ab.py --out "$res" --name wgmma_medium \
  --setting fp32_wgmma=off --setting fp32_wgmma=3xtf32 --setting fp32_wgmma=3xtf32-chop \
  --config 784-1024-1024-10:sgd:fp32 --config 784-1024-1024-10:adam:fp32 --rounds 3
TAILN=4 peers peers_jax 150 --worker jax --tag "$TAG" --models 784-1024-1024-10 \
  --precisions fp32 --mnist-seeds 10
for split in 3xtf32 3xtf32-chop off; do  # off last: its times are known from earlier calls
  FUSEFLOW_FP32_WGMMA=$split TAILN=4 peers "peers_fuseflow_$split" 120 --worker fuseflow \
    --tag "${TAG}_$split" --models 784-1024-1024-10 --precisions fp32 --mnist-seeds 10
done
