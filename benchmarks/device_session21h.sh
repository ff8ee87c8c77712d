#!/usr/bin/env bash
# Eighteenth session, calls 93-94: after call 92 (one test's float64 tolerance was tighter than
# the GPU's matmul and GELU rounding; the masks agreed), the random-bits, Dropout, compile,
# fit and GPU-layer tests again on the final code. Results: $OUT/results-s21h.tgz.
set -uo pipefail
TAG=s21h
source "$(dirname "$0")/_device_lib.sh"
TAILN=10 run pytest_random 300 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_random_bits.py tests/test_compile.py tests/test_train.py tests/test_gpu_layers.py \
  tests/test_gpu_head.py
