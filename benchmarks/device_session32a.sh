#!/usr/bin/env bash
# Prepared at the end of the twenty-eighth session for the next one (no device time was
# left). First every GPU test on the final tree: the review fixes after call 119 touched
# the host paths only (the NumPy update, the memory check, the checkpoint writer's layout,
# which GPU arrays reach through the host). Then the 16-bit Adam step's spread from
# process to process (calls 117-120: 1,477-1,529 us in two groups): fuseflow four times
# and JAX twice, alternating, with the GPU's SM clock, temperature and power sampled
# around each process (nvidia-smi), to tell a clock or thermal cause from one in the
# process (memory placement, plans). Results: $OUT/results-s32a.tgz.
set -uo pipefail
TAG=s32a
source "$(dirname "$0")/_device_lib.sh"
all_gpu_tests 330
spread_16bit 60
tar czf "$OUT/results-$TAG.tgz" -C "$res" .
