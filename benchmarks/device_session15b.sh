#!/usr/bin/env bash
# The twelfth session's second call: the fused head with its column sums in the new
# sum_partials kernel (call 55 ran them through sum_chunks: 8.1 us for the small model).
# Its GPU tests, the compiled steps' kernels with and without it, then fuseflow (with and
# without) and JAX side by side on the small and medium models with time to 98%, and the
# command line. Results: $OUT/results-s15b.tgz.
set -uo pipefail
TAG=s15b
source "$(dirname "$0")/_device_lib.sh"
TAILN=15 run pytest_head 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_gpu_head.py \
  tests/test_gpu_backend.py -k "head or fused or loss_gradient or skinny"
CONFIGS=784-30-10:sgd:fp32,784-30-10:adam:fp32,784-1024-1024-10:sgd:fp32,784-1024-1024-10:adam:fp32
for f in 1 0; do
  FUSEFLOW_FUSED_HEAD=$f TAILN=5 run "profile_head$f" 90 python3 benchmarks/profile_step.py --framework fuseflow \
    --out "$res" --tag "s15b_head$f" --configs "$CONFIGS"
done
SMALL=(--models 784-30-10,784-1024-1024-10 --precisions fp32,tf32)
TAILN=6 peers peers_fuseflow 150 "${SMALL[@]}" --mnist-seeds 5 --worker fuseflow --tag s15b
FUSEFLOW_FUSED_HEAD=0 TAILN=6 peers peers_fuseflow_head0 60 "${SMALL[@]}" --no-mnist --worker fuseflow --tag s15b_head0
TAILN=6 peers peers_jax 200 "${SMALL[@]}" --mnist-seeds 5 --worker jax --tag s15b
cli_runs 60
