#!/usr/bin/env bash
# A GPU call for changed kernels: every GPU test, the kernel variants side by side
# (benchmarks/kernels.py), fuseflow's and JAX's peers numbers from one machine, fuseflow
# again with its own epilogs off (FUSEFLOW_OWN_EPILOG=off) and with autotuning on the large
# model, and the kernel profile. Results: $OUT/results-last.tgz, rewritten after every step.
set -uo pipefail
TAG=last
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run pytest_gpu 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider
TAILN=40 run kernels 60 python3 benchmarks/kernels.py --out "$res"
TAILN=20 run peers_fuseflow 60 python3 benchmarks/peers.py --worker fuseflow --out "$res" --data-dir .devdata/mnist
FUSEFLOW_OWN_EPILOG=off TAILN=14 run peers_fuseflow_own_epilog_off 45 python3 benchmarks/peers.py --worker fuseflow --out "$res" --no-mnist --tag own_epilog_off
TAILN=20 run peers_jax 130 python3 benchmarks/peers.py --worker jax --out "$res" --data-dir .devdata/mnist
TAILN=3 run profile_fuseflow 40 python3 benchmarks/profile_step.py --framework fuseflow --out "$res"
FUSEFLOW_AUTOTUNE=1 TAILN=8 run peers_fuseflow_autotune 60 python3 benchmarks/peers.py --worker fuseflow --out "$res" --no-mnist --tag autotune --models 784-4096-4096-10
