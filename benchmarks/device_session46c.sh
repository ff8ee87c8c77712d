#!/usr/bin/env bash
# Forty-third session, the last ~250 s of device time (failed starts ate the rest): the
# wgmma kernel's GPU tests (tests/test_wgmma.py: kernel against float64, backend against
# cuBLASLt, fallbacks, compiled step against eager), the compiled medium fp32 steps with
# fp32_wgmma off / rounded / chopped side by side (settings_ab.py, three rounds), then, as
# time allows, JAX's medium fp32 steps (no time to 98%). Results: $OUT/results-s46c.tgz.
set -uo pipefail
TAG=${TAG:-s46c}
source "$(dirname "$0")/_device_lib.sh"
TAILN=15 run pytest_wgmma 100 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_wgmma.py
TAILN=12 run ab_wgmma 90 python3 benchmarks/settings_ab.py --out "$res" --name wgmma_medium \
  --setting fp32_wgmma=off --setting fp32_wgmma=3xtf32 --setting fp32_wgmma=3xtf32-chop \
  --config 784-1024-1024-10:sgd:fp32 --config 784-1024-1024-10:adam:fp32 --rounds 3
TAILN=4 peers peers_jax 60 --worker jax --tag "$TAG" --models 784-1024-1024-10 \
  --precisions fp32 --no-mnist
