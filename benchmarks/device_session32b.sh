#!/usr/bin/env bash
# Twenty-ninth session's second GPU call: the optimizer update with streaming cache hints
# (_cuda_fused.UPDATE_CACHE_HINTS=1: evict-first loads of every input and stores of the
# params and moments, the float16 copy the next forward reads stored plainly). The 16-bit
# Adam update moves 569 MB in 154 us (3.7 TB/s, call 117's timeline). First the test that
# both forms give the same bits, then the kernel alone against a device-to-device copy of
# as many bytes (kernels.py), then the compiled 16-bit large steps with and without the
# hints, alternating (settings_ab.py), and the hinted step against JAX's bf16 step and
# matmul in the same call. Results: $OUT/results-s32b.tgz.
set -uo pipefail
TAG=s32b
source "$(dirname "$0")/_device_lib.sh"
gpu_tests pytest_hints 120 "cache_hints"
TAILN=12 run kernels 150 python3 benchmarks/kernels.py --out "$res" --repeat 30
ab hints 240 4 _cuda_fused.UPDATE_CACHE_HINTS=0 _cuda_fused.UPDATE_CACHE_HINTS=1
export FUSEFLOW_UPDATE_CACHE_HINTS=1
TAILN=3 peers peers_fuseflow_hints 60 --worker fuseflow --tag s32b_hints \
  --models 784-4096-4096-10 --precisions 16bit --no-mnist
unset FUSEFLOW_UPDATE_CACHE_HINTS
TAILN=3 peers peers_jax_large 90 --worker jax --tag s32b_hints \
  --models 784-4096-4096-10 --precisions 16bit --no-mnist
