#!/usr/bin/env bash
# Fifth session, last call: every GPU test on the final code, and fuseflow train on the
# GPU in float32 and float16. Results: $OUT/results-s8b.tgz.
set -uo pipefail
TAG=s8b
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 380 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider
cli_runs 60
