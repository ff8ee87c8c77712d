#!/usr/bin/env bash
# The thirteenth session's first call, on the twelfth session's final commit (42bade4),
# whose last changes (shared forward sums, _cuda_gemm's finisher macros, the weight-gradient
# order helper, _check_linear, the review mends) were checked off the GPU only: every GPU
# test, the own matmul's included, then the command line. Results: $OUT/results-s16a.tgz.
set -uo pipefail
TAG=s16a
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 470 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests
cli_runs 40
