#!/usr/bin/env bash
# Forty-fifth session, second call: every GPU test with the 3xTF32 wgmma kernel on
# (FUSEFLOW_FP32_WGMMA=3xtf32; the step to making it the default on cc 9.0), then paired
# time to 98% (same init and epoch order on both sides, --mnist-start shared, 20 seeds) for
# JAX and for fuseflow with the kernel rounded and chopped. Results: $OUT/results-s48a.tgz.
set -uo pipefail
TAG=${TAG:-s48a}
source "$(dirname "$0")/_device_lib.sh"
FUSEFLOW_FP32_WGMMA=3xtf32 gpu_groups 200 110
for split in 3xtf32 3xtf32-chop; do
  FUSEFLOW_FP32_WGMMA=$split paired98 "peers_fuseflow_$split" 60 fuseflow "${TAG}_$split"
done
paired98 peers_jax_shared 150 jax "${TAG}_jax"
