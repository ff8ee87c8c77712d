#!/usr/bin/env bash
# Thirty-ninth session, first call: every GPU test but the kernel sources' on the tree the
# thirty-eighth session left (its mixed-precision GELU head test, the skinny GELU forward's
# launch-shape and padding checks and the _activation_grad refactor had not run on a GPU),
# then the 16-bit large GELU steps of fuseflow and JAX, one process each.
# Results: $OUT/results-s42a.tgz.
set -uo pipefail
TAG=${TAG:-s42a}
source "$(dirname "$0")/_device_lib.sh"
gpu_groups 230 130
for w in fuseflow jax; do
  TAILN=6 peers "peers_gelu16_$w" 100 --worker "$w" --tag "${TAG}_gelu16" \
    --models 784-4096-4096-10 --precisions 16bit --activation gelu --no-mnist
done
