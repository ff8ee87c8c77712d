#!/usr/bin/env bash
# Written in the thirty-eighth session for the next one (not run yet; the session's device
# time ran out): the mixed-precision fused head with GELU below (test_gpu_head.py's
# test_mixed_precision_fused_head[...gelu_medium], added after call 180), the other GELU
# head tests, the skinny GELU forward's launch-shape and padding checks, and the tests of
# the aux preparation that _activation_grad now shares (activation kernels, copies,
# dgrad); then the 16-bit large GELU steps of fuseflow and JAX, one process each.
# Results: $OUT/results-s41d.tgz.
set -uo pipefail
TAG=${TAG:-s41d}
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_head_gelu 240 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_gpu_head.py tests/test_gpu_backend.py \
  -k "mixed_precision or gelu or skinny_launch_shapes or small_side_and_only_it or activation_kernels or copies or dgrad_matches"
for w in fuseflow jax; do
  TAILN=6 peers "peers_gelu16_$w" 120 --worker "$w" --tag "${TAG}_gelu16" \
    --models 784-4096-4096-10 --precisions 16bit --activation gelu --no-mnist
done
