#!/usr/bin/env bash
# Forty-seventh session, fourth call: a product the wgmma kernel does not split along K now
# takes its bias/ReLU or ReLU-gradient pass in place (no second (M, N) plane; call 201-202
# put the 784-4096-4096-10 Adam step's pool at 1.249x what must be alive). The kernel's GPU
# tests (among them the new in-place test), the fp32 steps and pools of all three models
# (fuseflow only, --no-mnist; JAX's from calls 201-202), then call 158's heavy GPU group.
# Results: $OUT/results-s50c.tgz.
set -uo pipefail
TAG=${TAG:-s50c}
source "$(dirname "$0")/_device_lib.sh"
wgmma_tests 60
TAILN=7 peers peers_fuseflow 60 --worker fuseflow --tag "$TAG" \
  --models 784-30-10,784-1024-1024-10,784-4096-4096-10 --precisions fp32 --no-mnist
gpu_heavy 260
