#!/usr/bin/env bash
# The eleventh session's sixth call: the FP64 route taken back out (the epilogs' source is
# session 13's again). Call 54 profiled the 16-bit Adam step's drelu at 67 us, against
# 38 us in calls 24-29 (its SASS, read again after this call, stores 2- and 4-byte pieces
# where the old kernel stores 16 bytes): the same profile, twice, on the code as before.
# Results: $OUT/results-s14f.tgz.
set -uo pipefail
TAG=s14f
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run profile_16bit 120 python3 benchmarks/profile_step.py --framework fuseflow --out "$res" --tag s14f \
  --configs 784-4096-4096-10:adam:16bit,784-4096-4096-10:adam:16bit,784-1024-1024-10:sgd:fp32
