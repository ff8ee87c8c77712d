#!/usr/bin/env bash
# The tenth session's first call: is a faster full-float32 matmul possible at the medium
# model's shapes? Nsight Compute's counters for cuBLASLt's SIMT kernel against fuseflow's own
# kernel (layer-2 forward), then Triton's SIMT matmul over a grid of launch shapes against
# torch.mm without TF32. Results: $OUT/results-s13a.tgz.
set -uo pipefail
TAG=s13a
source "$(dirname "$0")/_device_lib.sh"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee "$res/versions.txt"
TAILN=4 run ncu_gemm_pair 150 ncu --clock-control none --profile-from-start off \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section InstructionStats python3 benchmarks/gemm_pair.py
TAILN=8 run triton_fp32_probe 400 python3 benchmarks/triton_fp32_probe.py --out "$res"
