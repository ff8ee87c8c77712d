#!/usr/bin/env bash
# Nineteenth session, call 102, the new defaults (overlap order "early", two side streams,
# the split update): fuseflow and JAX peers in one call (with the time to 98% and memory),
# the CLI on the GPU, then the GPU tests other than the backend's own and the own matmul's
# (unchanged by this session) as far as 270 s go. Results: $OUT/results-s22e.tgz.
set -uo pipefail
TAG=s22e
source "$(dirname "$0")/_device_lib.sh"
TAILN=4 peers peers_fuseflow 90 --worker fuseflow --tag s22e
TAILN=4 peers peers_jax 200 --worker jax --tag s22e
cli_runs 50
TAILN=10 run pytest_gpu_rest 270 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests \
  --ignore=tests/test_kernel_sources.py --ignore=tests/test_gpu_backend.py \
  --ignore=tests/test_own_gemm.py
