#!/usr/bin/env bash
# A GPU call for a kernel change before the final one: every GPU test, the launch-shape
# sweep of the skinny gradients and mixed precision's update (benchmarks/skinny_sweep.py),
# fuseflow's peers numbers without MNIST, and the kernel profile of each benchmark step.
# Results: $OUT/results-sweep.tgz, rewritten after every step.
set -uo pipefail
TAG=sweep
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 240 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider
TAILN=4 run skinny_sweep 120 python3 benchmarks/skinny_sweep.py --out "$res"
TAILN=20 run peers_fuseflow 100 python3 benchmarks/peers.py --worker fuseflow --out "$res" --no-mnist
TAILN=3 run profile_fuseflow 60 python3 benchmarks/profile_step.py --framework fuseflow --out "$res"
