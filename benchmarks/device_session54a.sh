#!/usr/bin/env bash
# Fifty-first session, first call, asked of nvidia-h200: the H200 has not been reached
# since calls 149-150, so every target's latest H200 number predates the 3xTF32 default.
# On an H200: the whole matrix (call 205's), then two interleaved_16bit.py processes (1.5 s
# windows, as call 212) and a peers.py 16-bit pair. On any other GPU it stops at once, so
# that an H100 costs only its start. Results: $OUT/results-$TAG.tgz.
set -uo pipefail
TAG=${TAG:-s54a}
source "$(dirname "$0")/_device_lib.sh"
if ! grep -q H200 "$res/env.txt"; then
  echo "not an H200, stopping:"; cat "$res/env.txt"; tar czf "$OUT/results-$TAG.tgz" -C "$res" .
  exit 0
fi
whole_matrix
interleaved_16bit interleaved_1 150 --tag "${TAG}_1" --rounds 3 --window 1.5
interleaved_16bit interleaved_2 150 --tag "${TAG}_2" --rounds 3 --window 1.5
pair_16bit 45
