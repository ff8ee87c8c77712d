#!/usr/bin/env bash
# The sixteenth session's fifth call: every GPU test on the session's code (the own K split
# on by default), then the command line on the GPU in float32 and float16.
# Results: $OUT/results-s19e.tgz.
set -uo pipefail
TAG=s19e
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 450 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests
cli_runs 60
