#!/usr/bin/env bash
# Thirty-first session, call 132: the 3xTF32 form kept (each k-tile's tensor-core sums
# added with round-to-nearest; calls 129-131 ran it as "tf32x3p") against float64 once
# more, then every GPU test on the session's tree (the exact bfloat16/float32 widening
# casts, the renamed 3xTF32 launches). Results: $OUT/results-s34d.tgz.
set -uo pipefail
TAG=s34d
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run tf32x3_probe 60 python3 benchmarks/tf32x3_probe.py --out "$res"
all_gpu_tests 440
tar czf "$OUT/results-$TAG.tgz" -C "$res" .
