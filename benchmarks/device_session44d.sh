#!/usr/bin/env bash
# Forty-first session: the wgmma probe with each thread's load and convert offsets worked
# out before the main loop (call 193's Nsight Compute: the loop was instruction-bound),
# the full sweep; then Nsight Compute on layer 2's forward as in call 193.
# Results: $OUT/results-s44d.tgz.
set -uo pipefail
TAG=${TAG:-s44d}
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run wgmma_probe 240 python3 benchmarks/wgmma_probe.py --out "$res" --name wgmma_probe_hoisted
TAILN=3 run ncu_hoisted 90 ncu --clock-control none --profile-from-start off \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section SchedulerStats --section InstructionStats \
  python3 benchmarks/wgmma_probe.py --ncu
