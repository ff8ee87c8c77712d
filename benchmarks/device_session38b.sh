#!/usr/bin/env bash
# Thirty-fifth session: fuseflow and JAX on the whole matrix, one process each (time to 98%
# with independent starts, five seeds, as before), then time to 98% from shared starts
# (peers.py --mnist-start shared: the same init and epoch orders on both sides, ten seeds
# or SHARED_SEEDS; only the small fp32 steps besides), then the CLI on the GPU. ORDER sets
# the workers' order. Results: $OUT/results-$TAG.tgz.
set -uo pipefail
TAG=${TAG:-s38b}
source "$(dirname "$0")/_device_lib.sh"
ORDER=${ORDER:-fuseflow jax} SHARED_SEEDS=${SHARED_SEEDS:-10}
for w in $ORDER; do
  TAILN=12 peers "peers_$w" 200 --worker "$w" --tag "$TAG" --mnist-start independent \
    --mnist-seeds 5  # peers.py's defaults when calls 159 and 162 ran
done
for w in $ORDER; do
  TAILN=4 peers "peers_${w}_shared" 120 --worker "$w" --tag "${TAG}_shared" \
    --models 784-30-10 --precisions fp32 --mnist-start shared --mnist-seeds "$SHARED_SEEDS"
done
cli_runs 60
