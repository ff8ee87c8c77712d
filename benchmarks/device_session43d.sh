#!/usr/bin/env bash
# Fortieth session, last call: the medium and small 16-bit ReLU and GELU steps with every
# epilog through the own pass (own_epilog=all, forwards included) against the default,
# side by side: do the 16-bit rules leave speed there? Results: $OUT/results-s43d.tgz.
set -uo pipefail
TAG=${TAG:-s43d}
source "$(dirname "$0")/_device_lib.sh"
for act in relu gelu; do
  TAILN=4 run "ab_all_$act" 90 python3 benchmarks/settings_ab.py --out "$res" --name "own_all_${act}_s43d" \
    --activation "$act" --rounds 3 --setting own_epilog=auto --setting own_epilog=all \
    --config 784-1024-1024-10:sgd:bf16 --config 784-1024-1024-10:adam:bf16 \
    --config 784-30-10:sgd:bf16 --config 784-30-10:adam:bf16
done
