#!/usr/bin/env bash
# The session's last GPU call: every GPU test, then fuseflow's peers numbers (all models,
# time to 98% on MNIST), JAX's for the small and medium models in the same call, and the
# kernel profile of each benchmark step. Results: $OUT/results-verify.tgz.
set -uo pipefail
TAG=verify
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider
TAILN=20 run peers_fuseflow 100 python3 benchmarks/peers.py --worker fuseflow --out "$res" --data-dir .devdata/mnist
TAILN=10 run peers_jax 80 python3 benchmarks/peers.py --worker jax --out "$res" --no-mnist --models 784-30-10,784-1024-1024-10
TAILN=3 run profile_fuseflow 40 python3 benchmarks/profile_step.py --framework fuseflow --out "$res"
