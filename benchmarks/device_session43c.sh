#!/usr/bin/env bash
# Fortieth session: the medium model's 16-bit GELU steps with the own DGELU pass
# (cuda_backend.HALF_DGELU_MIN = 0) against the default (cuBLASLt's fused 16-bit DGELU
# under 2^21 batch x features), side by side; the probe after its load_operand refactor
# (--quick); then Nsight Compute on layer 2's forward
# (256 x 1024 x 1024): cuBLASLt in TF32 and float32 and tf32x3_pipe_probe.py's kernel with
# one and three products, to see why the probe's kernel takes twice cuBLASLt's TF32 time.
# Results: $OUT/results-s43c.tgz.
set -uo pipefail
TAG=${TAG:-s43c}
source "$(dirname "$0")/_device_lib.sh"
TAILN=4 run ab_half_dgelu 120 python3 benchmarks/settings_ab.py --out "$res" --name half_dgelu_s43c \
  --activation gelu --rounds 3 --setting own_epilog=auto --setting cuda_backend.HALF_DGELU_MIN=0 \
  --config 784-1024-1024-10:sgd:bf16 --config 784-1024-1024-10:adam:bf16 \
  --config 784-30-10:sgd:bf16 --config 784-30-10:adam:bf16
TAILN=8 run tf32x3_pipe_quick 90 python3 benchmarks/tf32x3_pipe_probe.py --out "$res" --quick \
  --name tf32x3_pipe_probe_refactor
TAILN=60 run ncu_pipe 200 ncu --clock-control none --profile-from-start off \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis \
  python3 benchmarks/tf32x3_pipe_probe.py --out "$res" --ncu
