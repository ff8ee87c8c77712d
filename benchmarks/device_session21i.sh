#!/usr/bin/env bash
# Eighteenth session, call 95: the review fixes of the Dropout change (rate 0 keeps every
# element, a float16 factor that overflows is refused, the stream word checked, GPU keys
# through DLPack, layer keys only where a layer takes them, the grid-stride loop tested):
# the GPU tests of random bits, Dropout, compile, fit, GPU layers, the head and the docs'
# examples, then dropout_step.py again. Results: $OUT/results-s21i.tgz.
set -uo pipefail
TAG=s21i
source "$(dirname "$0")/_device_lib.sh"
TAILN=10 run pytest_random 300 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_random_bits.py tests/test_compile.py tests/test_train.py tests/test_gpu_layers.py \
  tests/test_gpu_head.py tests/test_docs.py
TAILN=6 run dropout_step 120 python3 benchmarks/dropout_step.py --out "$res"
