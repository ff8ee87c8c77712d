#!/usr/bin/env bash
# The eleventh session's second call: the float64 tensor-core probe at the medium model's
# matmuls, through the backend's cuBLASLt plans (call 49 ran it through CuPy's cuBLAS
# calls, which a CUDA graph cannot capture). Results: $OUT/results-s14b.tgz.
set -uo pipefail
TAG=s14b
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run fp64_probe 120 python3 benchmarks/fp64_probe.py --out "$res"
