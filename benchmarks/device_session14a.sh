#!/usr/bin/env bash
# The eleventh session's first call: the own full-float32 matmul's GPU tests after its
# cluster rank became blockIdx.z and its launch rule one function (cluster_fits), and the
# float64 tensor-core probe at the medium model's matmuls. Results: $OUT/results-s14a.tgz.
set -uo pipefail
TAG=s14a
source "$(dirname "$0")/_device_lib.sh"
TAILN=6 run pytest_own_gemm 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_own_gemm.py
TAILN=8 run fp64_probe 120 python3 benchmarks/fp64_probe.py --out "$res"
