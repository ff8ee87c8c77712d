#!/usr/bin/env bash
# Twenty-eighth session's third GPU call: the 16-bit Adam step's share of JAX's bf16 matmul
# over more runs (fuseflow three times, JAX twice, alternating, default settings: one run
# of each gave 79.6% in call 28b, two gave 80.4% and 80.0% in call 31a); the command line
# on the GPU (float32, float16); fuseflow and JAX on the small and medium models in fp32
# and TF32, for the full-precision targets. Results: $OUT/results-s31b.tgz.
set -uo pipefail
TAG=s31b
source "$(dirname "$0")/_device_lib.sh"
for r in 1 2 3; do
  TAILN=3 peers "peers_fuseflow_large_$r" 60 --worker fuseflow --tag "s31b_large_$r" \
    --models 784-4096-4096-10 --precisions 16bit --no-mnist
  [ "$r" = 3 ] || TAILN=3 peers "peers_jax_large_$r" 60 --worker jax --tag "s31b_jaxlarge_$r" \
    --models 784-4096-4096-10 --precisions 16bit --no-mnist
done
cli_runs 60
TAILN=5 peers peers_fuseflow_fp32 60 --worker fuseflow --tag s31b_fp32 \
  --models 784-30-10,784-1024-1024-10 --precisions fp32,tf32 --no-mnist
TAILN=5 peers peers_jax_fp32 120 --worker jax --tag s31b_fp32 \
  --models 784-30-10,784-1024-1024-10 --precisions fp32,tf32 --no-mnist
