#!/usr/bin/env bash
# Eighteenth session, calls 91-92: Dropout's masks drawn on the GPU (ff.random.bits,
# _cuda_random): the GPU tests of the random bits, Dropout, compile, fit and the GPU
# layers, then what Dropout costs in a compiled medium step (dropout_step.py).
# Results: $OUT/results-s21g.tgz.
set -uo pipefail
TAG=s21g
source "$(dirname "$0")/_device_lib.sh"
TAILN=10 run pytest_random 300 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_random_bits.py tests/test_compile.py tests/test_train.py tests/test_gpu_layers.py
TAILN=6 run dropout_step 120 python3 benchmarks/dropout_step.py --out "$res"
