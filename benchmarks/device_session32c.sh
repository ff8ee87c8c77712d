#!/usr/bin/env bash
# Twenty-ninth session, for whichever GPU is lent (H200s did not start): the streaming
# cache hints of the optimizer update (as device_session32b.sh: the bit-for-bit test, the
# kernel alone against a device copy, the compiled 16-bit large steps with and without,
# alternating), then every GPU test on the tree. Results: $OUT/results-s32c.tgz.
set -uo pipefail
TAG=s32c
source "$(dirname "$0")/_device_lib.sh"
gpu_tests pytest_hints 90 "cache_hints"
TAILN=12 run kernels 120 python3 benchmarks/kernels.py --out "$res" --repeat 30
ab hints 200 3 _cuda_fused.UPDATE_CACHE_HINTS=0 _cuda_fused.UPDATE_CACHE_HINTS=1
all_gpu_tests 300
