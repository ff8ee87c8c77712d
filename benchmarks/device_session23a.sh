#!/usr/bin/env bash
# Twentieth session, call 104: every GPU test on the nineteenth session's final commit
# (its review fixes had run only 126 of them), four pytest-xdist workers on the one GPU
# (each its own process and CUDA context). Results: $OUT/results-s23a.tgz.
set -uo pipefail
TAG=s23a
source "$(dirname "$0")/_device_lib.sh"
TAILN=25 run pytest_gpu_all 540 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  -n 4 --dist loadfile tests --ignore=tests/test_kernel_sources.py
