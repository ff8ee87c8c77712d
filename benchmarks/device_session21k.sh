#!/usr/bin/env bash
# Eighteenth session, call 97, the last device seconds: the GPU tests on the final code
# other than the backend's own (unchanged since call 89's full run) and the kernel sources
# (run on the CPU machine), as far as 180 s go. Results: $OUT/results-s21k.tgz.
set -uo pipefail
TAG=s21k
source "$(dirname "$0")/_device_lib.sh"
TAILN=10 run pytest_gpu_rest 180 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests \
  --ignore=tests/test_kernel_sources.py --ignore=tests/test_gpu_backend.py
