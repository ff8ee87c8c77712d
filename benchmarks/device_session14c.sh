#!/usr/bin/env bash
# The eleventh session's third call: where the GPU time goes in compiled steps run wholly
# in float64 (FP64 tensor cores) against full float32. Results: $OUT/results-s14c.tgz.
set -uo pipefail
TAG=s14c
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run profile_fp64 300 python3 benchmarks/profile_step.py --framework fuseflow --out "$res" --tag s14c \
  --configs 784-1024-1024-10:sgd:fp32,784-1024-1024-10:sgd:fp64,784-1024-1024-10:adam:fp32,784-1024-1024-10:adam:fp64,784-30-10:sgd:fp64,784-4096-4096-10:sgd:fp64
