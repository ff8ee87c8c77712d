#!/usr/bin/env bash
# Written in the thirty-seventh session for the next one (not run yet): the GELU forward's
# routing side by side. With TF32, own_epilog "auto" (cuBLASLt's GELU_AUX_BIAS forward, the
# own DGELU pass) against "all" (the own GELU forward too), the medium and large GELU steps,
# alternating rounds; calls 174-175 compared them only across two calls. Then the GELU
# steps of fuseflow and JAX in one call (call 175's JAX process ran out of time).
# Results: $OUT/results-s40d.tgz.
set -uo pipefail
TAG=${TAG:-s40d}
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run ab_gelu_forward_tf32 200 python3 benchmarks/settings_ab.py --out "$res" \
  --name gelu_forward_tf32 --activation gelu --setting own_epilog=auto --setting own_epilog=all \
  --config 784-1024-1024-10:sgd:tf32 --config 784-1024-1024-10:adam:tf32 \
  --config 784-4096-4096-10:sgd:tf32 --config 784-4096-4096-10:adam:tf32 --rounds 3
for w in fuseflow jax; do
  TAILN=14 peers "peers_gelu_$w" 150 --worker "$w" --tag "${TAG}_gelu" \
    --precisions fp32,tf32 --activation gelu --no-mnist
done
