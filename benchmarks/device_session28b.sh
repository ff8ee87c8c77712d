#!/usr/bin/env bash
# Twenty-fifth session's second call, prepared without a device: fuseflow against JAX on
# the targets the batch cast can move, in one call (peers.py): the 16-bit large model (the
# Adam step's share of JAX's bf16 8192^3 matmul of the same call; target 80%) and, for
# the record, the medium model in full float32 (target 0.75x of JAX; the cast does not
# touch it). Results: $OUT/results-s28b.tgz.
set -uo pipefail
TAG=s28b
source "$(dirname "$0")/_device_lib.sh"
TAILN=4 peers peers_fuseflow_large 110 --worker fuseflow --tag s28b_large \
  --models 784-4096-4096-10 --precisions 16bit --no-mnist
TAILN=4 peers peers_jax_large 140 --worker jax --tag s28b_large \
  --models 784-4096-4096-10 --precisions 16bit --no-mnist
TAILN=4 peers peers_fuseflow_medium 90 --worker fuseflow --tag s28b_medium \
  --models 784-1024-1024-10 --precisions fp32 --no-mnist
TAILN=4 peers peers_jax_medium 110 --worker jax --tag s28b_medium \
  --models 784-1024-1024-10 --precisions fp32 --no-mnist
