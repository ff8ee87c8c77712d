#!/usr/bin/env bash
# The sixth session's second call: fuseflow and JAX on every model, time to 98% in full
# fp32 and with TF32 on both sides (5 seeds each, JAX warmed up like fuseflow), the 16-bit
# reference timed before and after the models; then the 16-bit large model with every
# matmul autotuned against the default ("auto": float32 only), alternating, two rounds, and
# a kernel profile of the tuned 16-bit Adam step.
# Results: $OUT/results-s9b.tgz.
set -uo pipefail
TAG=s9b
source "$(dirname "$0")/_device_lib.sh"
TAILN=6 peers peers_fuseflow 120 --worker fuseflow --mnist-precisions fp32,tf32 --tag s9b
TAILN=6 peers peers_jax 240 --worker jax --mnist-precisions fp32,tf32 --tag s9b
for r in 1 2; do
  for at in 1 auto; do
    FUSEFLOW_AUTOTUNE=$at TAILN=3 peers "peers_fuseflow_at${at}_r$r" 60 --worker fuseflow \
      --models 784-4096-4096-10 --precisions 16bit --no-mnist --tag "at${at}_r$r"
  done
done
FUSEFLOW_AUTOTUNE=1 TAILN=3 run profile_fuseflow_at1 60 python3 benchmarks/profile_step.py \
  --framework fuseflow --out "$res" --configs 784-4096-4096-10:adam:16bit --tag s9b_at1
