#!/usr/bin/env bash
# Eighteenth session, call 90: the whole matrix again with the current code, one process
# per framework in one call (fuseflow with the time to 98%, torch eager and torch.compile
# default / reduce-overhead, JAX with the time to 98%); the hand-written nvmath pattern ran
# in call 89. Results: $OUT/results-s21f.tgz.
set -uo pipefail
TAG=s21f
source "$(dirname "$0")/_device_lib.sh"
TAILN=4 peers peers_fuseflow 90 --worker fuseflow --tag s21f
TAILN=4 peers peers_torch 260 --no-mnist --worker torch --tag s21f
TAILN=4 peers peers_jax 220 --worker jax --tag s21f
