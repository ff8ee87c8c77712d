#!/usr/bin/env bash
# Thirty-first session, call 129: every GPU test on the thirtieth session's final tree
# with the bfloat16 tensor-core output-layer kernels re-applied (commit 65d2a8f, which no
# GPU had run): this covers the unscaled bfloat16 make_step, the float32 bias corrections
# on CuPy, the 16-bit casts in the graph's copy and the HALF_HEADERS kernels too. Then the
# 16-bit large steps, float16 and bfloat16 alternating (two rounds), and JAX's bf16 step.
# Results: $OUT/results-s34a.tgz.
set -uo pipefail
TAG=s34a
source "$(dirname "$0")/_device_lib.sh"
all_gpu_tests 330
for r in 1 2; do for p in fp16 bf16; do
  TAILN=2 peers "peers_fuseflow_${p}_$r" 60 --worker fuseflow --tag "${TAG}_${p}_$r" \
    --models 784-4096-4096-10 --precisions 16bit --no-mnist --fuseflow-16bit "$p"
done; done
TAILN=3 peers peers_jax 60 --worker jax --tag "${TAG}_bf16_2" \
  --models 784-4096-4096-10 --precisions 16bit --no-mnist
tar czf "$OUT/results-$TAG.tgz" -C "$res" .
