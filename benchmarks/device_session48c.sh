#!/usr/bin/env bash
# Forty-fifth session, the last call: the two GPU tests that call 196 failed with the
# 3xTF32 kernel on by default (they count cuBLASLt's plans and autotuned products, and now
# turn the kernel off), the CLI on the GPU with the new default (float32, float16), then
# paired time to 98% with the chopped split and JAX's, 20 seeds. Results: $OUT/results-s48c.tgz.
set -uo pipefail
TAG=${TAG:-s48c}
source "$(dirname "$0")/_device_lib.sh"
TAILN=6 run pytest_fixed 60 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  "tests/test_gpu_backend.py::test_no_fallbacks_or_copies_on_ordinary_shapes" \
  "tests/test_compile.py::test_compile_default_autotunes_only_large_float32_matmuls"
cli_runs 60
FUSEFLOW_FP32_WGMMA=3xtf32-chop TAILN=4 peers peers_fuseflow_chop 40 --worker fuseflow \
  --tag "${TAG}_chop" --models 784-1024-1024-10 --precisions fp32 --mnist-start shared \
  --mnist-seeds 20
TAILN=4 peers peers_jax_shared 80 --worker jax --tag "${TAG}_jax" --models 784-1024-1024-10 \
  --precisions fp32 --mnist-start shared --mnist-seeds 20
