#!/usr/bin/env bash
# Seventeenth session, call 78: the K-split tests that call 19h was to run (no copies; the
# default settings at the medium shapes), the backend and compile tests on the one-epilog-call
# form of the unfused paths, and the medium steps' kernel timeline (start offsets, streams).
# Results: $OUT/results-s20a.tgz.
set -uo pipefail
TAG=s20a
source "$(dirname "$0")/_device_lib.sh"
TAILN=4 run pytest_k_split 100 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_k_split.py
TAILN=30 run pytest_backend_compile 300 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider --durations=15 \
  tests/test_gpu_backend.py tests/test_compile.py
TAILN=3 run profile 90 python3 benchmarks/profile_step.py --framework fuseflow --out "$res" --tag "$TAG" \
  --configs 784-1024-1024-10:sgd:fp32,784-1024-1024-10:adam:fp32,784-30-10:sgd:fp32
