#!/usr/bin/env bash
# The fifteenth session's first call: where the own matmul's float64 tensor-core form
# loses its time. Nsight Compute on the medium model's layer-2 forward: the own kernel
# (mma f64, default launch and one block per tile), cuBLASLt's SIMT path and its float64
# kernel, with warp stalls, pipe use and the stall sites in the SASS. Results:
# $OUT/results-s18a.tgz.
set -uo pipefail
TAG=s18a
source "$(dirname "$0")/_device_lib.sh"
NCU=(ncu --clock-control none --profile-from-start off --set full --import-source no)
TAILN=4 run ncu_f64 240 "${NCU[@]}" --page details --print-details all \
  python3 benchmarks/gemm_pair.py --mma f64 --dgemm
# (call 66 passed --print-details to this run too, which ncu refuses with --page source)
TAILN=4 run ncu_f64_source 200 "${NCU[@]}" --page source --print-source sass -k regex:simt_gemm \
  --launch-count 1 python3 benchmarks/gemm_pair.py --mma f64
