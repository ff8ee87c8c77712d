#!/usr/bin/env bash
# The twelfth session's last call, on its final code (fused head on, overlap order "after"
# by default): every GPU test but the own matmul's (unchanged since call 49, off by
# default), then the command line. (A first try with the peers in front lost its machine;
# the budget left no room for them.) Results: $OUT/results-s15d.tgz.
set -uo pipefail
TAG=s15d
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 330 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests \
  --ignore=tests/test_own_gemm.py
cli_runs 40
