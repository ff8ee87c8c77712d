#!/usr/bin/env bash
# Fiftieth session, second call: call 212 found the plain 8192^3 matmuls power-capped
# (burst 790-820 TFLOP/s falling to 680-737 within a 1.5 s window, SM clock ~1300-1525 MHz)
# while the 16-bit step held ~1820-1850 MHz. Here the same contenders in 5 s windows (3 s
# settling), two processes, to see where each settles over a training-like stretch.
# On an H200 the whole matrix runs after the first process instead of the second.
# Results: $OUT/results-$TAG.tgz.
set -uo pipefail
TAG=${TAG:-s53b}
source "$(dirname "$0")/_device_lib.sh"
long() { interleaved_16bit "interleaved_long_$1" 240 --tag "${TAG}_$1" --rounds 3 --window 5 \
  --settle 3 --gap 1; }
long 1
if grep -q H200 "$res/env.txt"; then whole_matrix; else long 2; fi
