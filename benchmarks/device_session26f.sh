#!/usr/bin/env bash
# Twenty-third session's last call, for what device time was left after the refused
# starts: every GPU test on the session's final code (four pytest-xdist workers, test by
# test). Results: $OUT/results-s26f.tgz.
set -uo pipefail
TAG=s26f
source "$(dirname "$0")/_device_lib.sh"
TAILN=25 run pytest_gpu_all 240 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  $(xdist load) tests --ignore=tests/test_kernel_sources.py
