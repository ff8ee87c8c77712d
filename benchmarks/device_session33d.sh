#!/usr/bin/env bash
# Thirtieth session, not run (too little device time was left to start a machine): the
# bfloat16 form of the tensor-core output-layer kernels, commit 65d2a8f, reverted on main
# until a GPU has run it; re-apply it first (git cherry-pick 65d2a8f). Their tests
# (exact on integers, the backend's choice, the one-pass gradients, the fused loss), the
# bfloat16 tests again, then the 16-bit large steps, float16 and bfloat16 alternating (two
# rounds), and JAX's bf16 step. Results: $OUT/results-s33d.tgz.
set -uo pipefail
TAG=s33d
source "$(dirname "$0")/_device_lib.sh"
TAILN=15 run pytest_tc 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider $(xdist load) \
  tests/test_gpu_tc_xent.py tests/test_bfloat16.py tests/test_gpu_backend.py \
  -k "skinny_tc or linear_grads or one_pass or xent or bfloat16"
for r in 1 2; do for p in fp16 bf16; do
  TAILN=2 peers "peers_fuseflow_${p}_$r" 60 --worker fuseflow --tag "${TAG}_${p}_$r" \
    --models 784-4096-4096-10 --precisions 16bit --no-mnist --fuseflow-16bit "$p"
done; done
TAILN=3 peers peers_jax 60 --worker jax --tag "${TAG}_bf16_2" \
  --models 784-4096-4096-10 --precisions 16bit --no-mnist
tar czf "$OUT/results-$TAG.tgz" -C "$res" .
