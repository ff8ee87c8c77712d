#!/usr/bin/env bash
# Thirty-ninth session, third call: 16-bit DGELU[_BGRAD] takes the own pass by default now
# (call 182: the large 16-bit GELU step's output-layer DGELU_BGRAD was a SIMT matmul plus a
# 307 us cuBLASLt epilog kernel). Every GPU test but the kernel sources' on that tree; then
# the 16-bit GELU steps, the default against own_epilog=fp32 (the routing before:
# cuBLASLt's 16-bit GELU epilogs), large and medium, and fuseflow's and JAX's 16-bit large
# GELU steps in peers.py, one process each. Results: $OUT/results-s42c.tgz.
set -uo pipefail
TAG=${TAG:-s42c}
source "$(dirname "$0")/_device_lib.sh"
gpu_groups 230 130
TAILN=4 run ab_gelu16 150 python3 benchmarks/settings_ab.py --out "$res" --name gelu16_s42c \
  --activation gelu --rounds 2 --setting own_epilog=auto --setting own_epilog=fp32 \
  --config 784-4096-4096-10:sgd:bf16 --config 784-4096-4096-10:adam:bf16 \
  --config 784-1024-1024-10:sgd:bf16 --config 784-1024-1024-10:adam:bf16
for w in fuseflow jax; do
  TAILN=4 peers "peers_gelu16_$w" 100 --worker "$w" --tag "${TAG}_gelu16" \
    --models 784-4096-4096-10 --precisions 16bit --activation gelu --no-mnist
done
