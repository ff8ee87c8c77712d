#!/usr/bin/env bash
# Thirty-fourth session: the GPU tests of mixed_precision.compute_copy (bfloat16 without loss
# scaling, the 16-bit gradients read by the fused update), then the large bfloat16 step with
# dynamic loss scaling and without (compute_copy), alternating over four rounds (the arm
# order swapped each round), JAX's bf16 step and 8192^3 matmul in rounds 2 and 4.
# Results: $OUT/results-s37a.tgz.
set -uo pipefail
TAG=${TAG:-s37a}
source "$(dirname "$0")/_device_lib.sh"
TAILN=15 run pytest_gpu_compute_copy 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_bfloat16.py tests/test_split_update.py tests/test_mixed_precision.py \
  tests/test_mixed_precision_audit.py
for r in 1 2 3 4; do
  arms="dynamic none"; [ $((r % 2)) = 0 ] && arms="none dynamic"
  for arm in $arms; do
    TAILN=2 peers "peers_${arm}_$r" 60 --worker fuseflow --tag "${TAG}_${arm}_$r" \
      --models 784-4096-4096-10 --precisions 16bit --no-mnist --fuseflow-loss-scaling "$arm"
  done
  if [ $((r % 2)) = 0 ]; then
    TAILN=2 peers "peers_jax_$r" 60 --worker jax --tag "${TAG}_jax_$r" \
      --models 784-4096-4096-10 --precisions 16bit --no-mnist
  fi
done
