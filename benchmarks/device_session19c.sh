#!/usr/bin/env bash
# The sixteenth session's third call: the K-split probe's compiled steps (0 / auto / 4,
# alternating), the output layer's weight gradient on the main stream instead of beside
# layer 2's input gradient (FUSEFLOW_OVERLAP_SKINNY=0 against 1, alternating, small and
# medium models, with a profile), then JAX and fuseflow on every model with the time to
# 98% (5 seeds) in one call. Results: $OUT/results-s19c.tgz. FUSEFLOW_OVERLAP_SKINNY was an
# experiment's switch, removed after this call (not adopted): a rerun times one form twice.
set -uo pipefail
TAG=s19c
source "$(dirname "$0")/_device_lib.sh"
TAILN=30 run splitk_probe 200 python3 benchmarks/splitk_probe.py --out "$res"
SM=(--models 784-30-10,784-1024-1024-10 --precisions fp32 --no-mnist --worker fuseflow)
for r in 1 2; do for v in 1 0; do
  FUSEFLOW_OVERLAP_SKINNY=$v TAILN=4 peers "peers_fuseflow_skinny${v}_$r" 60 "${SM[@]}" --tag "s19c_skinny${v}_$r"
done; done
for v in 1 0; do
  FUSEFLOW_OVERLAP_SKINNY=$v TAILN=3 run "profile_skinny$v" 60 python3 benchmarks/profile_step.py \
    --framework fuseflow --out "$res" --tag "${TAG}_skinny$v" \
    --configs "784-30-10:sgd:fp32,784-1024-1024-10:sgd:fp32,784-1024-1024-10:adam:fp32"
done
TAILN=6 peers peers_jax 260 --mnist-seeds 5 --worker jax --tag s19c
TAILN=6 peers peers_fuseflow 150 --mnist-seeds 5 --worker fuseflow --tag s19c
