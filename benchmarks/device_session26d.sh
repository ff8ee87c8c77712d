#!/usr/bin/env bash
# Twenty-third session's last call: every GPU test on the session's final code (four
# pytest-xdist workers, test by test), then the CLI on the GPU in float32 and float16.
# Results: $OUT/results-s26d.tgz.
set -uo pipefail
TAG=s26d
source "$(dirname "$0")/_device_lib.sh"
TAILN=25 run pytest_gpu_all 390 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  $(xdist load) tests --ignore=tests/test_kernel_sources.py
cli_runs 80
