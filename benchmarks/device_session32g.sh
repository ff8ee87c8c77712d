#!/usr/bin/env bash
# Twenty-ninth session, for the last device minutes if an H200 starts: the 16-bit Adam
# step's spread from process to process against JAX's bf16 matmul (device_session32a.sh's
# second half, without the GPU tests, which call 121 ran): fuseflow four times and JAX
# twice, alternating, with the GPU's SM clock, temperature and power sampled around each
# process. Results: $OUT/results-s32g.tgz.
set -uo pipefail
TAG=s32g
source "$(dirname "$0")/_device_lib.sh"
spread_16bit 40
