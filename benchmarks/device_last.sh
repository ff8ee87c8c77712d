#!/usr/bin/env bash
# A short GPU call for a changed kernel: its GPU tests, then fuseflow's and JAX's peers numbers
# (one call, so the ratios come from one machine), fuseflow again with only the skinny
# input-gradient kernels (FUSEFLOW_SKINNY_OPS=dgrad) for a side-by-side, and the kernel
# profile. Results: $OUT/results-last.tgz, rewritten after every step.
set -uo pipefail
TAG=last
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run pytest_gpu 100 python3 -m pytest -m gpu -q -x -rfE -p no:cacheprovider tests/test_gpu_backend.py tests/test_compile.py
TAILN=16 run peers_fuseflow 60 python3 benchmarks/peers.py --worker fuseflow --out "$res" --data-dir .devdata/mnist
TAILN=16 run peers_jax 130 python3 benchmarks/peers.py --worker jax --out "$res" --data-dir .devdata/mnist
FUSEFLOW_SKINNY_OPS=dgrad TAILN=6 run peers_fuseflow_dgrad_only 45 python3 benchmarks/peers.py --worker fuseflow --out "$res" --no-mnist --tag skinny_dgrad_only --models 784-30-10,784-1024-1024-10
TAILN=3 run profile_fuseflow 40 python3 benchmarks/profile_step.py --framework fuseflow --out "$res" --configs 784-30-10:sgd:fp32,784-1024-1024-10:sgd:fp32,784-4096-4096-10:adam:16bit
