#!/usr/bin/env bash
# Thirty-third session, after call 139 turned the output layer's one-pass gradients on by
# default and made bfloat16 peers.py's fuseflow 16-bit dtype: every GPU test on that tree
# within LIMIT seconds of the script's start (default 430), then the large 16-bit steps with
# the new defaults (bfloat16, and float16 with the pass) beside JAX's bf16 step and matmul.
# Results: $OUT/results-s36d.tgz.
set -uo pipefail
TAG=s36d
LIMIT=${LIMIT:-430}
source "$(dirname "$0")/_device_lib.sh"
all_gpu_tests $((LIMIT - SECONDS))
for p in bf16 fp16; do
  TAILN=2 peers "peers_$p" 60 --worker fuseflow --tag "${TAG}_$p" \
    --models 784-4096-4096-10 --precisions 16bit --no-mnist --fuseflow-16bit "$p"
done
TAILN=2 peers peers_jax 60 --worker jax --tag "${TAG}_jax" \
  --models 784-4096-4096-10 --precisions 16bit --no-mnist
