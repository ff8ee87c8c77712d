#!/usr/bin/env bash
# Forty-third session, second call (after device_session45b.sh, which runs the wgmma GPU tests,
# the settings A/B and JAX's and fuseflow's "off" peers): fuseflow's peers with the 3xTF32
# kernel rounded and chopped (medium model, fp32, step times and time to 98% over 10 seeds),
# then every GPU test but the kernel sources' with FUSEFLOW_FP32_WGMMA=3xtf32, to see whether
# it can be the default on compute capability 9.0. Results: $OUT/results-s46a.tgz.
set -uo pipefail
TAG=${TAG:-s46a}
source "$(dirname "$0")/_device_lib.sh"
for split in 3xtf32 3xtf32-chop; do
  FUSEFLOW_FP32_WGMMA=$split TAILN=4 peers "peers_fuseflow_$split" 120 --worker fuseflow \
    --tag "${TAG}_$split" --models 784-1024-1024-10 --precisions fp32 --mnist-seeds 10
done
FUSEFLOW_FP32_WGMMA=3xtf32 gpu_groups 230 110
