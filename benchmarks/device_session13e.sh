#!/usr/bin/env bash
# The tenth session's last call: every GPU test on the session's final code (the own
# matmul's cluster launches, int widths for Dense/LayerNorm init), then fuseflow train on
# the GPU in float32 and float16. Results: $OUT/results-s13e.tgz.
set -uo pipefail
TAG=s13e
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 430 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests
cli_runs 60
