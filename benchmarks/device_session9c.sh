#!/usr/bin/env bash
# The sixth session's third call: fuseflow and JAX on every model (no time to 98%), with the
# 16-bit reference matmul measured with uniform and normal operands, before and after the
# models, and JAX's own bfloat16 8192^3 matmul as a cross-check; then fuseflow's 16-bit
# large model once more. Results: $OUT/results-s9c.tgz.
set -uo pipefail
TAG=s9c
source "$(dirname "$0")/_device_lib.sh"
TAILN=6 peers peers_fuseflow 100 --no-mnist --worker fuseflow --tag s9c
TAILN=6 peers peers_jax 150 --no-mnist --worker jax --tag s9c
TAILN=3 peers peers_fuseflow_r2 60 --no-mnist --worker fuseflow --models 784-4096-4096-10 \
  --precisions 16bit --tag s9c_r2
