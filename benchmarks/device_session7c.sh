#!/usr/bin/env bash
# Fourth session, third call: every GPU test on the session's code, the command line's
# training runs (float32 and float16).
# Results: $OUT/results-s7c.tgz.
set -uo pipefail
TAG=s7c
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 340 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider
cli_runs 60
# (the profile of the changed steps is in call 2's results; device time is short)
