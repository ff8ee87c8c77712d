#!/usr/bin/env bash
# Thirty-sixth session, call 168: every framework of the issue's matrix on the current
# tree, one process each within one call (the last such run was calls 89-90): fuseflow
# (eager and compiled; time to 98% from shared starts, twenty seeds), the hand-written
# nvmath pattern, torch eager and torch.compile (default / reduce-overhead), JAX jit with
# optax (time to 98% likewise); then the CLI on the GPU. Results: $OUT/results-s39c.tgz.
set -uo pipefail
TAG=${TAG:-s39c}
source "$(dirname "$0")/_device_lib.sh"
whole_matrix
