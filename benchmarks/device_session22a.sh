#!/usr/bin/env bash
# Nineteenth session, call 98: every GPU test on HEAD (the Dropout work and the re-read
# commit 0ce0942 had not run together on the GPU), then the CLI on the GPU in float32 and
# float16. Results: $OUT/results-s22a.tgz.
set -uo pipefail
TAG=s22a
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu_all 470 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests \
  --ignore=tests/test_kernel_sources.py
cli_runs 50
