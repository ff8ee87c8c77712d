#!/usr/bin/env bash
# Forty-seventh session, after call 200: with fp32_wgmma = "3xtf32-lotrunc" now the default
# on cc 9.0, the fp32 steps of all three models against JAX, two alternating rounds
# (fuseflow, JAX, fuseflow, JAX; --no-mnist); paired time to 98% (--mnist-start shared,
# 20 seeds) for fuseflow's default and JAX; then call 158's heavy GPU test group (backend,
# compile, checkpoint, DRELU tail), which call 200 cut at 200 s with lotrunc set by hand.
# Results: $OUT/results-s50a.tgz.
set -uo pipefail
TAG=${TAG:-s50a}
source "$(dirname "$0")/_device_lib.sh"
peer_rounds 90 fp32
paired98 peers_fuseflow_shared 40 fuseflow "${TAG}_ff"
paired98 peers_jax_shared 90 jax "${TAG}_jax"
gpu_heavy 300
