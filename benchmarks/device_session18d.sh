#!/usr/bin/env bash
# The fifteenth session's last call, on its final code (the float64 staging backed out):
# every GPU test and the command line in float32 and float16. Results: $OUT/results-s18d.tgz.
set -uo pipefail
TAG=s18d
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 420 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests
cli_runs 60
