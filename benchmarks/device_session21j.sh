#!/usr/bin/env bash
# Eighteenth session, call 96: Dropout's forward in one pass (the factor and x * factor from
# one kernel, _cuda_random mode 2): its tests (every dtype, signed zeros, infinities, a
# strided input) and the GPU layers', then dropout_step.py again.
# Results: $OUT/results-s21j.tgz.
set -uo pipefail
TAG=s21j
source "$(dirname "$0")/_device_lib.sh"
TAILN=10 run pytest_random 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_random_bits.py tests/test_gpu_layers.py
TAILN=6 run dropout_step 120 python3 benchmarks/dropout_step.py --out "$res"
