#!/usr/bin/env bash
# The sixth session's first call: every GPU test on the code the fifth session left
# unverified (its review fixes after call 26), fuseflow train on the GPU in float32 and
# float16, and a sweep of layer 1's float16 forward by epilog and K (l1_epilog_sweep.py);
# with PEERS=1 also fuseflow and JAX on every model with the multi-seed time to 98%. Results: $OUT/results-s9a.tgz.
set -uo pipefail
TAG=s9a
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 330 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider
TAILN=20 run l1_epilog_sweep 60 python3 benchmarks/l1_epilog_sweep.py --out "$res"
cli_runs 50
if [ "${PEERS:-0}" = 1 ]; then
  TAILN=20 peers peers_fuseflow 150 --worker fuseflow --tag s9a
  TAILN=20 peers peers_jax 250 --worker jax --tag s9a
fi
