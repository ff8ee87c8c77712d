#!/usr/bin/env bash
# Forty-sixth session, run after device_session49a.sh in the same call (SPLIT from the caller):
# every GPU test (call 158's two groups) with fp32_wgmma set to $SPLIT (the candidate
# default; the tests that count cuBLASLt plans turn the kernel off themselves), the CLI on
# the GPU in float32 and float16, then the small and large fp32 steps with the kernel off /
# $SPLIT side by side (settings_ab.py, two rounds). Results: $OUT/results-s49b.tgz.
set -uo pipefail
TAG=${TAG:-s49b}
SPLIT=${SPLIT:-3xtf32}
export FUSEFLOW_FP32_WGMMA=$SPLIT
source "$(dirname "$0")/_device_lib.sh"
echo "FUSEFLOW_FP32_WGMMA=$SPLIT" >> "$res/env.txt"
gpu_groups 200 110
cli_runs 60
TAILN=12 run ab_wgmma_small_large 120 python3 benchmarks/settings_ab.py --out "$res" \
  --name wgmma_small_large --setting fp32_wgmma=off --setting "fp32_wgmma=$SPLIT" \
  --config 784-30-10:sgd:fp32 --config 784-30-10:adam:fp32 \
  --config 784-4096-4096-10:sgd:fp32 --config 784-4096-4096-10:adam:fp32 --rounds 2
