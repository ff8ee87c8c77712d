#!/usr/bin/env bash
# Eighteenth session, call 88: memsets kept or replayed as fill kernels, compiled steps
# side by side in one process (benchmarks/memset_probe.py, four alternating rounds).
# Results: $OUT/results-s21d.tgz.
set -uo pipefail
TAG=s21d
source "$(dirname "$0")/_device_lib.sh"
TAILN=20 run memset_probe 200 python3 benchmarks/memset_probe.py --out "$res" --rounds 4
