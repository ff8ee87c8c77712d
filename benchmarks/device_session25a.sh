#!/usr/bin/env bash
# Twenty-second session, call 110 (after 24a = call 107, 23d = call 108, and a medium /
# 16-bit settings A/B = call 109): fuseflow and JAX peers in one call (with the time to 98%
# and memory) on this session's final code, then the CLI on the GPU. Results:
# $OUT/results-s25a.tgz.
set -uo pipefail
TAG=s25a
source "$(dirname "$0")/_device_lib.sh"
TAILN=4 peers peers_fuseflow 120 --worker fuseflow --tag s25a
TAILN=4 peers peers_jax 240 --worker jax --tag s25a
cli_runs 60
