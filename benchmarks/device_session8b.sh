#!/usr/bin/env bash
# The next call (written at the end of the fifth session, whose device time ran out):
# every GPU test on the final code (the review fixes after call 26 included), fuseflow
# train on the GPU in float32 and float16, and fuseflow and JAX on every model with the
# multi-seed time to 98%. Results: $OUT/results-s8b.tgz.
set -uo pipefail
TAG=s8b
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 360 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider
cli_runs 60
TAILN=20 run peers_fuseflow 120 python3 benchmarks/peers.py --worker fuseflow --out "$res" --data-dir .devdata/mnist --tag s8b
TAILN=20 run peers_jax 200 python3 benchmarks/peers.py --worker jax --out "$res" --data-dir .devdata/mnist --tag s8b
