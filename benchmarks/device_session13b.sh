#!/usr/bin/env bash
# The tenth session's second call: the Triton full-float32 matmul probe (fixed: tl.dot's
# precision as a literal), and the warp stall reasons of cuBLASLt's SIMT kernel and the
# own kernel from Nsight Compute. Results: $OUT/results-s13b.tgz.
set -uo pipefail
TAG=s13b
source "$(dirname "$0")/_device_lib.sh"
TAILN=4 run ncu_stalls 150 ncu --clock-control none --profile-from-start off \
  --section WarpStateStats --section SourceCounters --print-details all \
  --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio \
  python3 benchmarks/gemm_pair.py
TAILN=8 run triton_fp32_probe 420 python3 benchmarks/triton_fp32_probe.py --out "$res"
