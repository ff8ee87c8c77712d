#!/usr/bin/env bash
# Twentieth session, call 107: an input gradient's plain matmul in its two operand
# orientations (orientation_probe.py: w.T @ dy.T, the backend's, against dy @ w), 16-bit,
# full float32 and TF32, the large and the medium model's hidden layer. Results:
# $OUT/results-s23d.tgz.
set -uo pipefail
TAG=s23d
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run orientation_probe 150 python3 benchmarks/orientation_probe.py --out "$res" --rounds 3
