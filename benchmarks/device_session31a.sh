#!/usr/bin/env bash
# Twenty-eighth session's second GPU call (after device_session28a-c.sh ran): fuseflow's
# 16-bit large steps with the output layer's forward and loss in one kernel (the default,
# fused_tc_xent) and apart (FUSEFLOW_FUSED_TC_XENT=0), alternating two rounds each, and
# JAX's bf16 steps with its 8192^3 matmul in the same call (the 80% target; call 28a's
# settings_ab.py had the two apart 0.6% faster); then every GPU test with a longer limit
# (28c's stopped at 97% after 240 s, with no failure). Results: $OUT/results-s31a.tgz.
set -uo pipefail
TAG=s31a
source "$(dirname "$0")/_device_lib.sh"
for r in 1 2; do
  TAILN=3 peers "peers_fuseflow_on_$r" 60 --worker fuseflow --tag "s31a_on_$r" \
    --models 784-4096-4096-10 --precisions 16bit --no-mnist
  export FUSEFLOW_FUSED_TC_XENT=0
  TAILN=3 peers "peers_fuseflow_off_$r" 60 --worker fuseflow --tag "s31a_off_$r" \
    --models 784-4096-4096-10 --precisions 16bit --no-mnist
  unset FUSEFLOW_FUSED_TC_XENT
done
TAILN=3 peers peers_jax_large 90 --worker jax --tag s31a_large \
  --models 784-4096-4096-10 --precisions 16bit --no-mnist
all_gpu_tests 330
