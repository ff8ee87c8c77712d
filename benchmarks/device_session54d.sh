#!/usr/bin/env bash
# Fifty-first session, last call, asked of nvidia-h200. On an H200: the whole matrix
# (call 205's; the H200 was last reached in calls 149-150), one interleaved_16bit.py process
# (1.5 s windows, as call 212) and a peers.py 16-bit pair, then the one-pass output layer's
# GPU tests with what time is left. On an H100 (calls 214-215 ran there): those tests alone
# (call 215's ran out of their 150 s after 7 passed). Results: $OUT/results-$TAG.tgz.
set -uo pipefail
TAG=${TAG:-s54d}
source "$(dirname "$0")/_device_lib.sh"
tc_head_tests() { TAILN=30 run pytest_tc_head "$1" python3 -m pytest -m gpu -q -rfE \
  -p no:cacheprovider tests/test_gpu_tc_head.py; }
if grep -q H200 "$res/env.txt"; then
  whole_matrix
  interleaved_16bit interleaved_1 150 --tag "${TAG}_1" --rounds 3 --window 1.5
  pair_16bit 45
  tc_head_tests 150
else
  tc_head_tests 420
fi
