#!/usr/bin/env bash
# Forty-seventh session, third call (run on the H100 still held after call 201): with
# "3xtf32-lotrunc" the default, the steps of all three models against JAX in full fp32 and
# with TF32 allowed on both sides, two alternating rounds (fuseflow, JAX, fuseflow, JAX;
# --no-mnist), then paired time to 98% (--mnist-start shared, 20 seeds) for fuseflow and
# JAX. Results: $OUT/results-s50b.tgz.
set -uo pipefail
TAG=${TAG:-s50b}
source "$(dirname "$0")/_device_lib.sh"
peer_rounds 120 fp32,tf32
paired98 peers_fuseflow_shared 40 fuseflow "${TAG}_ff"
paired98 peers_jax_shared 90 jax "${TAG}_jax"
