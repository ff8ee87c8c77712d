#!/usr/bin/env bash
# The thirteenth session's third call: "auto" overlap now also forks the tensor-core skinny
# weight gradient (the float16 output layer at batch 8192, memory-bound) to the side
# stream, beside layer 2's matmuls. Its GPU tests (overlap, head, backend's skinny kernels),
# the 16-bit steps' kernels with it against FUSEFLOW_OVERLAP_WGRAD=0 (the old "auto" for
# 16-bit: nothing overlapped), alternating, then fuseflow's and JAX's 16-bit steps with
# their dense-matmul references. Results: $OUT/results-s16c.tgz.
set -uo pipefail
TAG=s16c
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_overlap 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_overlap.py \
  tests/test_gpu_head.py tests/test_gpu_backend.py -k "overlap or skinny or head or Overlap"
CONFIGS=784-4096-4096-10:sgd:16bit,784-4096-4096-10:adam:16bit
for v in auto off auto off; do
  if [ $v = off ]; then export FUSEFLOW_OVERLAP_WGRAD=0; else unset FUSEFLOW_OVERLAP_WGRAD; fi
  TAILN=3 run "profile_$v" 90 python3 benchmarks/profile_step.py --framework fuseflow \
    --out "$res" --tag "s16c_$v" --configs "$CONFIGS"
  mv "$res/profile_fuseflow_s16c_$v.json" "$res/profile_fuseflow_s16c_${v}_$SECONDS.json"
done
unset FUSEFLOW_OVERLAP_WGRAD
L16=(--models 784-4096-4096-10 --precisions 16bit --no-mnist)
TAILN=4 peers peers_fuseflow 90 "${L16[@]}" --worker fuseflow --tag s16c
TAILN=4 peers peers_jax 120 "${L16[@]}" --worker jax --tag s16c
