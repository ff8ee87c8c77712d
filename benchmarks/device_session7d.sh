#!/usr/bin/env bash
# Fourth session, fourth call: fuseflow's and JAX's peers numbers for every model and
# precision, with time to 98% MNIST test accuracy, one process per framework in this one
# call (the ratios of docs/benchmarks.md). Results: $OUT/results-s7d.tgz.
set -uo pipefail
TAG=s7d
source "$(dirname "$0")/_device_lib.sh"
TAILN=20 run peers_fuseflow 160 python3 benchmarks/peers.py --worker fuseflow --out "$res" --data-dir .devdata/mnist --tag s7d
TAILN=20 run peers_jax 260 python3 benchmarks/peers.py --worker jax --out "$res" --data-dir .devdata/mnist --tag s7d
