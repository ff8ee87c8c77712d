#!/usr/bin/env bash
# Thirty-fourth session, with the device time left: the output layer's one-pass gradients
# (fused_skinny_grads, on by default since call 139, chosen from bfloat16 on an H100) off
# and on in the large 16-bit Adam step, in float16 (dynamic loss scaling) and in bfloat16
# (no loss scaling, peers.py's default now), three alternating rounds (settings_ab.py).
# Results: $OUT/results-s37h.tgz.
set -uo pipefail
TAG=${TAG:-s37h}
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run ab_skinny_grads 300 python3 benchmarks/settings_ab.py --out "$res" \
  --name skinny_grads_16bit --rounds 3 \
  --config 784-4096-4096-10:adam:fp16 --config 784-4096-4096-10:adam:bf16 \
  --setting fused_skinny_grads=0 --setting fused_skinny_grads=1
