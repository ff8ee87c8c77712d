#!/usr/bin/env bash
# Written in the thirty-ninth session for the next one (not run: no device time was left).
# The tree after the tensor-core GELU pass was backed out: every GPU test but the kernel
# sources' (the first group took over 215 s in call 183: limits raised; among its tests
# test_half_gelu_input_gradients_take_the_own_pass, which has not run on a GPU yet), then
# the 16-bit GELU steps: the default (own DGELU pass) against own_epilog=fp32 (cuBLASLt's
# 16-bit GELU epilogs), large and medium, side by side, and fuseflow's and JAX's large
# 16-bit GELU steps in peers.py, one process each. Results: $OUT/results-s42d.tgz.
set -uo pipefail
TAG=${TAG:-s42d}
source "$(dirname "$0")/_device_lib.sh"
# PART=tests or PART=bench runs one half (each fits one call); unset runs both.
PART=${PART:-all}
if [ "$PART" != bench ]; then gpu_groups 280 130; fi
if [ "$PART" = tests ]; then exit 0; fi
TAILN=6 run ab_gelu16 200 python3 benchmarks/settings_ab.py --out "$res" --name gelu16_s42d \
  --activation gelu --rounds 2 --setting own_epilog=auto --setting own_epilog=fp32 \
  --config 784-4096-4096-10:sgd:bf16 --config 784-4096-4096-10:adam:bf16 \
  --config 784-1024-1024-10:sgd:bf16 --config 784-1024-1024-10:adam:bf16
for w in fuseflow jax; do
  TAILN=4 peers "peers_gelu16_$w" 100 --worker "$w" --tag "${TAG}_gelu16" \
    --models 784-4096-4096-10 --precisions 16bit --activation gelu --no-mnist
done
