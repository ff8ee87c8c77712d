#!/usr/bin/env bash
# Thirtieth session: every GPU test on the final tree (the twenty-ninth session's
# loss-scaled host update has not run on a GPU machine), then the 16-bit Adam step's spread
# from process to process (fuseflow four times, JAX twice, alternating, with the GPU's
# clocks sampled around each process), then the medium full-fp32 pair (fuseflow, JAX).
# Results: $OUT/results-s33a.tgz.
set -uo pipefail
TAG=s33a
source "$(dirname "$0")/_device_lib.sh"
all_gpu_tests 300
spread_16bit 50
for w in fuseflow jax; do
  TAILN=2 peers "peers_${w}_medium" 60 --worker "$w" --tag "${TAG}_medium" \
    --models 784-1024-1024-10 --precisions fp32 --no-mnist
done
tar czf "$OUT/results-$TAG.tgz" -C "$res" .
