#!/usr/bin/env bash
# The eighth session's call: every GPU test on this session's changes (the activation
# check moved into Backend, fit's out_dir check, the shared test fixtures), and fuseflow
# train on the GPU in float32 and float16. Results: $OUT/results-s11a.tgz.
set -uo pipefail
TAG=s11a
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 340 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider
cli_runs 60
