#!/usr/bin/env bash
# Prepared in the sixteenth session, not run (its device time ran out): the K-split tests
# with their later additions (no copies; the default settings at the medium shapes).
# Results: $OUT/results-s19h.tgz.
set -uo pipefail
TAG=s19h
source "$(dirname "$0")/_device_lib.sh"
TAILN=4 run pytest_k_split 100 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_k_split.py
