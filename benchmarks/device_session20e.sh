#!/usr/bin/env bash
# Seventeenth session, call 82: JAX's side of peers.py (steps and time to 98%), the same
# call's fuseflow steps again for ratios within one call, and the CLI on the GPU.
# Results: $OUT/results-s20e.tgz.
set -uo pipefail
TAG=s20e
source "$(dirname "$0")/_device_lib.sh"
TAILN=4 peers peers_fuseflow 90 --worker fuseflow --tag s20e
TAILN=4 peers peers_jax 200 --worker jax --tag s20e
cli_runs 60
