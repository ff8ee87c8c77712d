#!/usr/bin/env bash
# Thirty-third session: the large 16-bit Adam step in float16 (peers.py's default then),
# in bfloat16 (JAX's dtype; peers.py's fuseflow step keeps dynamic loss scaling in both)
# and in bfloat16 with the output layer's two gradients in one pass (FUSEFLOW_FUSED_SKINNY_GRADS=1),
# alternating over four rounds, JAX's bf16 step and 8192^3 matmul in rounds 2 and 4.
# Results: $OUT/results-s36c.tgz.
set -uo pipefail
TAG=s36c
source "$(dirname "$0")/_device_lib.sh"
for r in 1 2 3 4; do
  for arm in fp16 bf16 bf16grads; do
    dt=${arm%grads}; export FUSEFLOW_FUSED_SKINNY_GRADS=$([ "$arm" = bf16grads ] && echo 1 || echo 0)
    TAILN=2 peers "peers_${arm}_$r" 60 --worker fuseflow --tag "${TAG}_${arm}_$r" \
      --models 784-4096-4096-10 --precisions 16bit --no-mnist --fuseflow-16bit "$dt"
  done
  unset FUSEFLOW_FUSED_SKINNY_GRADS
  if [ $((r % 2)) = 0 ]; then
    TAILN=2 peers "peers_jax_$r" 60 --worker jax --tag "${TAG}_jax_$r" \
      --models 784-4096-4096-10 --precisions 16bit --no-mnist
  fi
done
