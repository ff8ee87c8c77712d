#!/usr/bin/env bash
# The eleventh session's fifth call: the FP64 route off by default and its tests' shapes
# fixed; the epilog kernels' in-place form back to one restrict pointer (IN_PLACE). The
# GPU tests of the route, backend, layers, compile and fused optimizers; the compiled
# steps' kernels (medium float32, large 16-bit Adam: the epilogs' times); the CLI in
# float32 and float16. Results: $OUT/results-s14e.tgz.
set -uo pipefail
TAG=s14e
source "$(dirname "$0")/_device_lib.sh"
TAILN=15 run pytest_gpu 330 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_fp64_gemm.py tests/test_gpu_backend.py tests/test_gpu_layers.py tests/test_compile.py \
  tests/test_fused_optim.py
TAILN=8 run profile_steps 90 python3 benchmarks/profile_step.py --framework fuseflow --out "$res" --tag s14e \
  --configs 784-1024-1024-10:sgd:fp32,784-1024-1024-10:adam:fp32,784-4096-4096-10:adam:16bit
cli_runs 70
