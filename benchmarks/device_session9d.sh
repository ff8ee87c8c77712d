#!/usr/bin/env bash
# The sixth session's last call: time to 98% only, fuseflow and JAX with the same init
# (He normal in every layer, as jax_init), 10 seeds each, in full fp32 and with TF32.
# Results: $OUT/results-s9d.tgz.
set -uo pipefail
TAG=s9d
source "$(dirname "$0")/_device_lib.sh"
ONLY_MNIST=(--models none --precisions fp32 --mnist-seeds 10 --mnist-precisions fp32,tf32)
TAILN=3 peers peers_fuseflow 90 "${ONLY_MNIST[@]}" --worker fuseflow --tag s9d
TAILN=3 peers peers_jax 180 "${ONLY_MNIST[@]}" --worker jax --tag s9d
