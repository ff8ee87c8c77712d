#!/usr/bin/env bash
# The twelfth session's last call, on its final code (fused head on, overlap order "after"
# by default): fuseflow and JAX side by side on the small and medium models with time to
# 98%, then every GPU test, then the command line. Results: $OUT/results-s15d.tgz.
set -uo pipefail
TAG=s15d
source "$(dirname "$0")/_device_lib.sh"
SMALL=(--models 784-30-10,784-1024-1024-10 --precisions fp32,tf32 --mnist-seeds 5)
TAILN=4 peers peers_fuseflow 70 "${SMALL[@]}" --worker fuseflow --tag s15d
TAILN=4 peers peers_jax 130 "${SMALL[@]}" --worker jax --tag s15d
TAILN=12 run pytest_gpu 430 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests
cli_runs 40
