#!/usr/bin/env bash
# Thirtieth session: bfloat16 compute on the GPU. First its own tests (test_bfloat16.py and
# the backend's bfloat16 cases against the NumPy reference), then the large model's 16-bit
# steps with fuseflow in bfloat16 (twice) and float16, and JAX's bf16 step, then every GPU
# test until the call's time is spent. Results: $OUT/results-s33b.tgz.
set -uo pipefail
TAG=s33b
source "$(dirname "$0")/_device_lib.sh"
TAILN=25 run pytest_bf16 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider $(xdist load) \
  tests/test_bfloat16.py tests/test_gpu_backend.py -k "bfloat16"
for r in 1 2; do
  TAILN=3 peers "peers_fuseflow_bf16_$r" 60 --worker fuseflow --tag "${TAG}_bf16_$r" \
    --models 784-4096-4096-10 --precisions 16bit --no-mnist --fuseflow-16bit bf16
done
TAILN=3 peers peers_fuseflow_fp16 60 --worker fuseflow --tag "${TAG}_fp16" \
  --models 784-4096-4096-10 --precisions 16bit --no-mnist
TAILN=3 peers peers_jax 60 --worker jax --tag "${TAG}_bf16_2" \
  --models 784-4096-4096-10 --precisions 16bit --no-mnist
TAILN=8 run train_cuda_bf16 60 python3 -m fuseflow train --backend cuda --precision bfloat16 \
  --data-dir .devdata/mnist --out /tmp/rbf16 --no-progress
all_gpu_tests $((575 - SECONDS))
tar czf "$OUT/results-$TAG.tgz" -C "$res" .
