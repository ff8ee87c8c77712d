#!/usr/bin/env bash
# The seventh session's first call: every GPU test on this session's input-validation work
# (layers, losses, optimizers' update_and_apply, ff.compile's contract, CLI safety), and
# fuseflow train on the GPU in float32 and float16. Results: $OUT/results-s10a.tgz.
set -uo pipefail
TAG=s10a
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 340 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider
cli_runs 60
