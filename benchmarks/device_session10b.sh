#!/usr/bin/env bash
# The seventh session's second call: fuseflow (eager and compiled) and JAX jit on every
# model, one process each, to see that the new checks left the compiled step's time as it
# was (they run at capture) and what they cost the eager step. Results: $OUT/results-s10b.tgz.
set -uo pipefail
TAG=s10b
source "$(dirname "$0")/_device_lib.sh"
for w in fuseflow:80 jax:120; do
  TAILN=3 peers "peers_${w%:*}" "${w#*:}" --no-mnist --worker "${w%:*}" --tag s10b
done
