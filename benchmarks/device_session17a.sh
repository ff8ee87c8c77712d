#!/usr/bin/env bash
# The fourteenth session's first call: the FP64 tensor cores' mma.sync shapes (Ampere's
# m8n8k4 against Hopper's m16n8k{4,8,16}), their fragment layouts and instruction rates
# (benchmarks/dmma_probe.py). Results: $OUT/results-s17a.tgz.
set -uo pipefail
TAG=s17a
source "$(dirname "$0")/_device_lib.sh"
TAILN=40 run dmma_probe 120 python3 benchmarks/dmma_probe.py --out "$res"
