#!/usr/bin/env bash
# Thirty-ninth session, third call. Call 182 found the large 16-bit GELU step's output-layer
# DGELU_BGRAD running as a SIMT matmul plus a 307 us cuBLASLt epilog kernel; now 16-bit
# DGELU[_BGRAD] takes the own pass from own_epilog_min on, and on long batches at K <= 16
# the tensor-core skinny input gradient's new GELU form. Every GPU test but the kernel
# sources' on that tree; the 16-bit GELU steps' profile (call 182's profile_default is the
# routing before); the default against
# own_epilog=fp32 side by side (large); then peers.py: fuseflow's and JAX's
# 16-bit large GELU steps and fuseflow's ReLU ones, one process each.
# Results: $OUT/results-s42c.tgz.
set -uo pipefail
TAG=${TAG:-s42c}
source "$(dirname "$0")/_device_lib.sh"
gpu_groups 215 110
C=784-4096-4096-10:sgd:16bit,784-4096-4096-10:adam:16bit
TAILN=3 run profile_default 90 python3 benchmarks/profile_step.py --framework fuseflow \
  --activation gelu --configs $C --out "$res" --tag "${TAG}_default"
TAILN=4 run ab_gelu16 150 python3 benchmarks/settings_ab.py --out "$res" --name gelu16_s42c \
  --activation gelu --rounds 2 --setting own_epilog=auto --setting own_epilog=fp32 \
  --config 784-4096-4096-10:sgd:bf16 --config 784-4096-4096-10:adam:bf16
for w in fuseflow jax; do
  TAILN=4 peers "peers_gelu16_$w" 100 --worker "$w" --tag "${TAG}_gelu16" \
    --models 784-4096-4096-10 --precisions 16bit --activation gelu --no-mnist
done
TAILN=4 peers peers_relu16_fuseflow 100 --worker fuseflow --tag "${TAG}_relu16" \
  --models 784-4096-4096-10 --precisions 16bit --no-mnist
