#!/usr/bin/env bash
# Thirty-sixth session, written for call 173, which found no machine (folded into device_session40a.sh): TF32 bias/ReLU epilogs through the own pass (the own
# epilogs' "auto" mode now takes float32 with TF32 too). Every GPU test file but the
# kernel-source compile test (call 158's two groups), then fuseflow and JAX with TF32
# allowed, one process each. Results: $OUT/results-s39h.tgz.
set -uo pipefail
TAG=${TAG:-s39h}
source "$(dirname "$0")/_device_lib.sh"
gpu_groups 240 150
for w in fuseflow jax; do
  TAILN=8 peers "peers_$w" 100 --worker "$w" --tag "$TAG" --precisions tf32 --no-mnist
done
