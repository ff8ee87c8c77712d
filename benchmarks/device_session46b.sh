#!/usr/bin/env bash
# Forty-third session, one call in a tight device budget (failed starts ate most of it):
# device_session45b.sh with the rounded split's peers only, then device_session46a.sh's tests.
# The wgmma GPU tests and the compiled-step tests; the compiled medium fp32 steps with
# fp32_wgmma off / rounded / chopped side by side (settings_ab.py, three rounds); JAX's and
# fuseflow's peers (medium model, fp32, step times and time to 98% over 10 paired seeds).
# Results: $OUT/results-s46b.tgz.
set -uo pipefail
TAG=${TAG:-s46b}
source "$(dirname "$0")/_device_lib.sh"
TAILN=15 run pytest_wgmma 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_wgmma.py tests/test_own_gemm.py tests/test_compile.py -k "wgmma or compiled_step"
TAILN=12 run ab_wgmma 150 python3 benchmarks/settings_ab.py --out "$res" --name wgmma_medium \
  --setting fp32_wgmma=off --setting fp32_wgmma=3xtf32 --setting fp32_wgmma=3xtf32-chop \
  --config 784-1024-1024-10:sgd:fp32 --config 784-1024-1024-10:adam:fp32 --rounds 3
TAILN=4 peers peers_jax 150 --worker jax --tag "$TAG" --models 784-1024-1024-10 \
  --precisions fp32 --mnist-seeds 10
FUSEFLOW_FP32_WGMMA=3xtf32 TAILN=4 peers peers_fuseflow_3xtf32 120 --worker fuseflow \
  --tag "${TAG}_3xtf32" --models 784-1024-1024-10 --precisions fp32 --mnist-seeds 10
# then, as time allows: every GPU test but the kernel sources' with the rounded split on, to
# see whether it can be the default on compute capability 9.0
FUSEFLOW_FP32_WGMMA=3xtf32 gpu_groups 230 110
