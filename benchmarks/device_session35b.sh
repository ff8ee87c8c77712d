#!/usr/bin/env bash
# Thirty-second session, after device_session34c.sh (the untested pieces and every GPU
# test): fuseflow and JAX on the whole matrix in one call (every model, fp32 / TF32 /
# 16-bit, the time to 98% and memory) on the final tree, then the CLI on the GPU; the
# latest full matrix before this one was call 110. Results: $OUT/results-s35b.tgz.
set -uo pipefail
TAG=s35b
source "$(dirname "$0")/_device_lib.sh"
TAILN=4 peers peers_fuseflow 150 --worker fuseflow --tag s35b
TAILN=4 peers peers_jax 270 --worker jax --tag s35b
cli_runs 90
