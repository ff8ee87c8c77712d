#!/usr/bin/env bash
# Twenty-ninth session (call 121, an H100; on the tree of commit 02839b2, whose cache-hint
# option was reverted after it: measured slower), for the device time left after the
# failed starts: the update kernel alone with and without the streaming
# cache hints (kernels.py, against a device copy of as many bytes), every GPU test on the
# tree (the hints' bit-for-bit test among them), then the compiled 16-bit large steps
# with and without the hints, alternating. Results: $OUT/results-s32d.tgz.
set -uo pipefail
TAG=s32d
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run kernels 90 python3 benchmarks/kernels.py --out "$res" --repeat 20
all_gpu_tests 240
ab hints 150 2 _cuda_fused.UPDATE_CACHE_HINTS=0 _cuda_fused.UPDATE_CACHE_HINTS=1
