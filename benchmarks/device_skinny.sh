#!/usr/bin/env bash
# A GPU call for the skinny gradients with dy staged through shared memory: their tests
# (every launch shape against NumPy, staged equal to unstaged bit for bit), the overlap
# tests, and the launch-shape sweep with staging on and off (benchmarks/skinny_sweep.py).
# Results: $OUT/results-skinny.tgz.
set -uo pipefail
TAG=skinny
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run pytest_skinny 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_gpu_backend.py tests/test_overlap.py -k "skinny or overlap"
TAILN=4 run skinny_sweep 150 python3 benchmarks/skinny_sweep.py --out "$res"
