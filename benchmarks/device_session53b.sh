#!/usr/bin/env bash
# Fiftieth session, last call (about 200 s of device time left): one more
# interleaved_16bit.py process (1.5 s windows, as call 212), then a peers.py fuseflow/JAX
# pair on the 16-bit large model; asked of nvidia-h200 in case the H200 comes.
# Results: $OUT/results-$TAG.tgz.
set -uo pipefail
TAG=${TAG:-s53c}
source "$(dirname "$0")/_device_lib.sh"
interleaved_16bit interleaved_1 120 --tag "${TAG}_1" --rounds 3 --window 1.5
pair_16bit 45
