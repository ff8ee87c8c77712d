#!/usr/bin/env bash
# Twenty-ninth session, for the last device minutes if an H200 starts: the 16-bit Adam
# step's spread from process to process against JAX's bf16 matmul (device_session32a.sh's
# second half, without the GPU tests, which call 121 ran): fuseflow four times and JAX
# twice, alternating, with the GPU's SM clock, temperature and power sampled around each
# process. Results: $OUT/results-s32g.tgz.
set -uo pipefail
TAG=s32g
source "$(dirname "$0")/_device_lib.sh"
clocks() { nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv,noheader >> "$res/clocks_$1.csv" 2>&1; }
for r in 1 2 3 4; do
  clocks "fuseflow_$r"
  TAILN=2 peers "peers_fuseflow_large_$r" 40 --worker fuseflow --tag "s32g_large_$r" \
    --models 784-4096-4096-10 --precisions 16bit --no-mnist
  clocks "fuseflow_$r"
  if [ $((r % 2)) = 0 ]; then
    clocks "jax_$r"
    TAILN=2 peers "peers_jax_large_$r" 40 --worker jax --tag "s32g_large_$r" \
      --models 784-4096-4096-10 --precisions 16bit --no-mnist
    clocks "jax_$r"
  fi
done
