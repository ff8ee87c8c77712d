#!/usr/bin/env bash
# The thirteenth session's last call, on its final code (the own matmul's float64
# tensor-core form, off by default; the overlap rule as in call 60): every GPU test, the
# command line, then fuseflow and JAX on every model (no time to 98%), one process each.
# Results: $OUT/results-s16d.tgz.
set -uo pipefail
TAG=s16d
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 330 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests
cli_runs 40
TAILN=4 peers peers_fuseflow 60 --no-mnist --worker fuseflow --tag s16d
TAILN=4 peers peers_jax 130 --no-mnist --worker jax --tag s16d
