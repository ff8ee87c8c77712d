#!/usr/bin/env bash
# Thirty-sixth session, call 168: every framework of the issue's matrix on the current
# tree, one process each within one call (the last such run was calls 89-90): fuseflow
# (eager and compiled; time to 98% from shared starts, twenty seeds), the hand-written
# nvmath pattern, torch eager and torch.compile (default / reduce-overhead), JAX jit with
# optax (time to 98% likewise); then the CLI on the GPU. Results: $OUT/results-s39c.tgz.
set -uo pipefail
TAG=${TAG:-s39c}
source "$(dirname "$0")/_device_lib.sh"
TAILN=6 peers peers_fuseflow 120 --worker fuseflow --tag "$TAG"
TAILN=4 peers peers_hand_nvmath 100 --no-mnist --worker hand_nvmath --tag "$TAG"
TAILN=4 peers peers_torch 200 --no-mnist --worker torch --tag "$TAG"
TAILN=6 peers peers_jax 200 --worker jax --tag "$TAG"
cli_runs 60
