#!/usr/bin/env bash
# The sixth session's closing call: every framework of the issue in one call, one process
# each, on every model (no time to 98%): fuseflow, PyTorch eager and torch.compile (default
# and reduce-overhead, medium model), the hand-written nvmath pattern, JAX last (calls
# 28-30 have it). Results: $OUT/results-s9e.tgz, kept after each worker.
set -uo pipefail
TAG=s9e
source "$(dirname "$0")/_device_lib.sh"
for w in fuseflow:60 torch:90 hand_nvmath:40 jax:110; do
  TAILN=3 peers "peers_${w%:*}" "${w#*:}" --no-mnist --worker "${w%:*}" --tag s9e
done
