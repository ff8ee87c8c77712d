#!/usr/bin/env bash
# The 2026-12-03 third session's verification call (pytest needed more than its first
# 240 s limit; now 300): every GPU test, the command line's
# training runs (float32 and float16, per-epoch samples/s in metrics.jsonl), fuseflow's
# peers numbers for all models with time to 98%, JAX's small and medium models in the same
# call, and the kernel profile of each benchmark step. Results: $OUT/results-s6.tgz.
set -uo pipefail
TAG=s6
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 300 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider
cli_runs 60
TAILN=20 run peers_fuseflow 120 python3 benchmarks/peers.py --worker fuseflow --out "$res" --data-dir .devdata/mnist
TAILN=10 run peers_jax 80 python3 benchmarks/peers.py --worker jax --out "$res" --no-mnist --models 784-30-10,784-1024-1024-10
TAILN=3 run profile_fuseflow 60 python3 benchmarks/profile_step.py --framework fuseflow --out "$res"
