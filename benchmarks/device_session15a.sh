#!/usr/bin/env bash
# The twelfth session's first call: the fused output layer (_cuda_head). Its GPU tests,
# the compiled steps' kernels with it (FUSEFLOW_FUSED_HEAD=1) and without (=0), side by
# side, then the GPU tests of everything it touches. Results: $OUT/results-s15a.tgz.
set -uo pipefail
TAG=s15a
source "$(dirname "$0")/_device_lib.sh"
TAILN=25 run pytest_head 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_gpu_head.py
CONFIGS=784-30-10:sgd:fp32,784-30-10:adam:fp32,784-1024-1024-10:sgd:fp32,784-1024-1024-10:adam:fp32,784-4096-4096-10:adam:16bit
for f in 1 0; do
  FUSEFLOW_FUSED_HEAD=$f TAILN=6 run "profile_head$f" 100 python3 benchmarks/profile_step.py --framework fuseflow \
    --out "$res" --tag "s15a_head$f" --configs "$CONFIGS"
  mv "$res/profile_fuseflow_s15a_head$f.json" "$res/profile_fuseflow_s15a_head${f}_$SECONDS.json" 2>/dev/null
done
TAILN=20 run pytest_gpu 330 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_gpu_backend.py \
  tests/test_gpu_layers.py tests/test_overlap.py tests/test_compile.py tests/test_mixed_precision.py \
  tests/test_fused_optim.py tests/test_train.py tests/test_mlp_training.py
