#!/usr/bin/env bash
# The sixth session's last call: time to 98% only, fuseflow and JAX with the same init
# (He normal in every layer, as jax_init), 10 seeds each, in full fp32 and with TF32.
# Results: $OUT/results-s9d.tgz.
set -uo pipefail
TAG=s9d
source "$(dirname "$0")/_device_lib.sh"
P="python3 benchmarks/peers.py --out $res --data-dir .devdata/mnist --models none --precisions fp32 --mnist-seeds 10 --mnist-precisions fp32,tf32"
TAILN=3 run peers_fuseflow 90 $P --worker fuseflow --tag s9d
TAILN=3 run peers_jax 180 $P --worker jax --tag s9d
