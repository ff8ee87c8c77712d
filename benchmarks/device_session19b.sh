#!/usr/bin/env bash
# The sixteenth session's second call: the own K split's "auto" rule (default on): its
# tests and the compile tests, the probe (per matmul incl. "auto" and the CLI's eval
# shapes; compiled medium steps 0 / auto / 4, alternating), and fuseflow's peers rows with
# the split (every model, time to 98% over 5 seeds) and without it (medium only).
# Results: $OUT/results-s19b.tgz.
set -uo pipefail
TAG=s19b
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run pytest_k_split 240 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_k_split.py tests/test_compile.py
TAILN=60 run splitk_probe 200 python3 benchmarks/splitk_probe.py --out "$res"
TAILN=6 peers peers_fuseflow 150 --mnist-seeds 5 --worker fuseflow --tag s19b
FUSEFLOW_K_SPLITS=0 TAILN=6 peers peers_fuseflow_k0 60 --models 784-1024-1024-10 --no-mnist \
  --worker fuseflow --tag s19b_k0
