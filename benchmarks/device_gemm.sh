#!/usr/bin/env bash
# A GPU call for fuseflow's own float32 matmul: its tests and the backend's, the per-layer
# sweep against cuBLASLt (benchmarks/gemm_sweep.py), fuseflow's peers numbers without MNIST,
# the kernel profile of each benchmark step, then every GPU test.
# Results: $OUT/results-gemm.tgz, rewritten after every step.
set -uo pipefail
TAG=gemm
source "$(dirname "$0")/_device_lib.sh"
TAILN=15 run pytest_gemm 150 python3 -m pytest -q -x -rfE -p no:cacheprovider tests/test_own_gemm.py tests/test_kernel_sources.py
TAILN=12 run gemm_sweep 150 python3 benchmarks/gemm_sweep.py --out "$res"
TAILN=20 run peers_fuseflow 100 python3 benchmarks/peers.py --worker fuseflow --out "$res" --no-mnist
TAILN=3 run profile_fuseflow 60 python3 benchmarks/profile_step.py --framework fuseflow --out "$res"
TAILN=12 run pytest_gpu 240 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider
