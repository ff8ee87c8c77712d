#!/usr/bin/env bash
# The twelfth session's sixth call (59), on a warm machine with the last two minutes of the
# session's device time: fuseflow (final code) and JAX side by side, small and medium
# models, no time to 98%. Results: $OUT/r/peers_{fuseflow,jax}_s15e.json.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=".:/tmp/site"
mkdir -p "$OUT/r"
for w in fuseflow jax; do
  timeout 70 python3 benchmarks/peers.py --out "$OUT/r" --data-dir .devdata/mnist \
    --models 784-30-10,784-1024-1024-10 --precisions fp32,tf32 --no-mnist --worker $w \
    --tag s15e > "$OUT/r/peers_$w.log" 2>&1
  echo "$w rc=$?"
done
