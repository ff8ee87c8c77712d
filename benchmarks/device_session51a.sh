#!/usr/bin/env bash
# Forty-eighth session, first call: the whole matrix with "3xtf32-lotrunc" the default
# (call 168's device_session39c.sh: every framework, one process each, fuseflow and JAX
# with time to 98% from shared starts, then the CLI on the GPU in float32 and float16);
# the 16-bit large Adam step's spread, four fuseflow processes and two of JAX with the
# GPU's clocks (the 16-bit row was last measured in calls 149-168); and wgmma_splits.py,
# the first GPU run of its cuBLASLt float32 arm since that arm became
# gemm_sweep.cublaslt_fp32 (the kernel off). Results: $OUT/results-s51a.tgz.
set -uo pipefail
TAG=${TAG:-s51a}
source "$(dirname "$0")/_device_lib.sh"
whole_matrix
spread_16bit 60
TAILN=3 run wgmma_splits 60 python3 benchmarks/wgmma_splits.py --out "$res" --seeds 3
