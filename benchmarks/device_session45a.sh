#!/usr/bin/env bash
# Forty-second session: the wgmma probe with each thread's load and convert offsets worked
# out before the main loop (commit f0d2626; call 193's Nsight Compute found the loop
# instruction-bound), and a form with A's fragments split in registers (areg 1). First the
# --quick sweep (call 193's tiles, side by side with cuBLASLt), then Nsight Compute's
# instruction and scheduler sections on layer 2's forward as in call 193, then the full
# sweep of nine tiles (as far as its time limit lets it).
# Results: $OUT/results-s45a.tgz.
set -uo pipefail
TAG=${TAG:-s45a}
source "$(dirname "$0")/_device_lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$res/env.txt" 2>&1
TAILN=8 run wgmma_probe_quick 220 python3 benchmarks/wgmma_probe.py --out "$res" --quick \
  --name wgmma_probe_hoisted_quick
TAILN=3 run ncu_hoisted 120 ncu --clock-control none --profile-from-start off \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section SchedulerStats --section InstructionStats \
  python3 benchmarks/wgmma_probe.py --ncu
TAILN=8 run wgmma_probe_full 230 python3 benchmarks/wgmma_probe.py --out "$res" \
  --name wgmma_probe_hoisted
