#!/usr/bin/env bash
# The ninth session's second call: every framework of the issue in one call, one process
# each, on every model, now with the whole matrix the issue asks for: torch.compile
# (default and reduce-overhead) on all three models in fp32 and bf16, and the hand-written
# nvmath pattern with Adam and in fp16 too. No time to 98% (call 31 has it). Results:
# $OUT/results-s12b.tgz, kept after each worker.
set -uo pipefail
TAG=s12b
source "$(dirname "$0")/_device_lib.sh"
for w in fuseflow:70 torch:220 hand_nvmath:80 jax:120; do
  TAILN=4 peers "peers_${w%:*}" "${w#*:}" --no-mnist --worker "${w%:*}" --tag s12b
done
