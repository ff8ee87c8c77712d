#!/usr/bin/env bash
# The sixth session's closing call: every framework of the issue in one call, one process
# each, on every model (no time to 98%): fuseflow, PyTorch eager and torch.compile (default
# and reduce-overhead, medium model), the hand-written nvmath pattern, JAX last (calls
# 28-30 have it). Results: $OUT/results-s9e.tgz, kept after each worker.
set -uo pipefail
TAG=s9e
source "$(dirname "$0")/_device_lib.sh"
P="python3 benchmarks/peers.py --out $res --data-dir .devdata/mnist --no-mnist"
TAILN=2 run peers_fuseflow 60 $P --worker fuseflow --tag s9e
TAILN=4 run peers_torch 90 $P --worker torch --tag s9e
TAILN=2 run peers_hand_nvmath 40 $P --worker hand_nvmath --tag s9e
TAILN=2 run peers_jax 110 $P --worker jax --tag s9e
