#!/usr/bin/env bash
# Forty-fifth session, after call 195: with fp32_wgmma = "3xtf32" now the default on cc 9.0,
# every GPU test (call 158's two groups); the small and large fp32 steps with the kernel
# off / on side by side (settings_ab.py, two rounds: it also takes the large model's
# products); then paired time to 98% (same init and epoch order, --mnist-start shared,
# 20 seeds) for fuseflow (default) and JAX. Results: $OUT/results-s48b.tgz.
set -uo pipefail
TAG=${TAG:-s48b}
source "$(dirname "$0")/_device_lib.sh"
gpu_groups 200 110
TAILN=12 run ab_wgmma_small_large 120 python3 benchmarks/settings_ab.py --out "$res" \
  --name wgmma_small_large --setting fp32_wgmma=off --setting fp32_wgmma=3xtf32 \
  --config 784-30-10:sgd:fp32 --config 784-30-10:adam:fp32 \
  --config 784-4096-4096-10:sgd:fp32 --config 784-4096-4096-10:adam:fp32 --rounds 2
TAILN=4 peers peers_fuseflow_shared 60 --worker fuseflow --tag "${TAG}_ff" \
  --models 784-1024-1024-10 --precisions fp32 --mnist-start shared --mnist-seeds 20
TAILN=4 peers peers_jax_shared 120 --worker jax --tag "${TAG}_jax" --models 784-1024-1024-10 \
  --precisions fp32 --mnist-start shared --mnist-seeds 20
