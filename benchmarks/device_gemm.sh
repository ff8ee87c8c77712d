#!/usr/bin/env bash
# A GPU call for fuseflow's own float32 matmul: its tests, the per-layer sweep against
# cuBLASLt (benchmarks/gemm_sweep.py), fuseflow's and JAX's step times for the small and
# medium models (no MNIST) in the same call, the kernel profile of each benchmark step, then
# every GPU test. Results: $OUT/results-gemm.tgz, rewritten after every step.
set -uo pipefail
TAG=gemm
source "$(dirname "$0")/_device_lib.sh"
SMALL=784-30-10,784-1024-1024-10
TAILN=15 run pytest_gemm 150 python3 -m pytest -q -x -rfE -p no:cacheprovider tests/test_own_gemm.py
TAILN=12 run gemm_sweep 140 python3 benchmarks/gemm_sweep.py --out "$res"
TAILN=10 run peers_fuseflow 60 python3 benchmarks/peers.py --worker fuseflow --out "$res" --no-mnist --models $SMALL
TAILN=10 run peers_jax 100 python3 benchmarks/peers.py --worker jax --out "$res" --no-mnist --models $SMALL
TAILN=3 run profile_fuseflow 40 python3 benchmarks/profile_step.py --framework fuseflow --out "$res"
TAILN=12 run pytest_gpu 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider
