#!/usr/bin/env bash
# Fortieth session, third call: Nsight Compute on layer 2's forward (256 x 1024 x 1024),
# cuBLASLt in TF32 and float32 and tf32x3_pipe_probe.py's kernel with one and three
# products: why the probe's kernel takes twice cuBLASLt's TF32 time. Results: $OUT/results-s43c.tgz.
set -uo pipefail
TAG=${TAG:-s43c}
source "$(dirname "$0")/_device_lib.sh"
TAILN=60 run ncu_pipe 200 ncu --clock-control none --profile-from-start off \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis \
  python3 benchmarks/tf32x3_pipe_probe.py --out "$res" --ncu
