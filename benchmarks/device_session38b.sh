#!/usr/bin/env bash
# Thirty-fifth session: fuseflow and JAX on the whole matrix, one process each (time to 98%
# with independent starts, five seeds, as before), then time to 98% from shared starts
# (peers.py --mnist-start shared: the same init and epoch orders on both sides, ten seeds;
# only the small fp32 steps besides), then the CLI on the GPU. Results: $OUT/results-s38b.tgz.
set -uo pipefail
TAG=${TAG:-s38b}
source "$(dirname "$0")/_device_lib.sh"
for w in fuseflow jax; do
  TAILN=12 peers "peers_$w" 200 --worker "$w" --tag "$TAG"
done
for w in fuseflow jax; do
  TAILN=4 peers "peers_${w}_shared" 120 --worker "$w" --tag "${TAG}_shared" \
    --models 784-30-10 --precisions fp32 --mnist-start shared --mnist-seeds 10
done
cli_runs 60
