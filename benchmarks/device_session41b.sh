#!/usr/bin/env bash
# Thirty-eighth session, after call 178: the GELU steps of fuseflow (the fused head and the
# skinny forward with GELU) and JAX in one call, fp32 and TF32, one process each.
# Results: $OUT/results-s41b.tgz.
set -uo pipefail
TAG=${TAG:-s41b}
source "$(dirname "$0")/_device_lib.sh"
for w in fuseflow jax; do
  TAILN=14 peers "peers_gelu_$w" 120 --worker "$w" --tag "${TAG}_gelu" \
    --precisions fp32,tf32 --activation gelu --no-mnist
done
