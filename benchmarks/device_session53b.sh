#!/usr/bin/env bash
# Fiftieth session, last call (about 200 s of device time left): one more
# interleaved_16bit.py process (1.5 s windows, as call 212), then a peers.py fuseflow/JAX
# pair on the 16-bit large model; asked of nvidia-h200 in case the H200 comes.
# Results: $OUT/results-$TAG.tgz.
set -uo pipefail
TAG=${TAG:-s53c}
source "$(dirname "$0")/_device_lib.sh"
TAILN=16 run interleaved_1 120 python3 benchmarks/interleaved_16bit.py \
  --out "$res" --tag "${TAG}_1" --rounds 3 --window 1.5
for w in fuseflow jax; do
  TAILN=2 peers "peers_${w}_large" 45 --worker "$w" --tag "${TAG}_large" \
    --models 784-4096-4096-10 --precisions 16bit --no-mnist
done
