#!/usr/bin/env bash
# A development call on the GPU machine: the GPU tests of what changed, where the step time
# goes (every kernel of fuseflow's compiled step), fuseflow and JAX step times side by side
# (quick), and every cuBLASLt algorithm for the medium model's matmuls.
# Results: $OUT/results-profile.tgz
set -uo pipefail
TAG=profile
source "$(dirname "$0")/_device_lib.sh"
TAILN=25 run pytest_gpu 240 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider ${TESTS:-tests}
TAILN=8 run profile_fuseflow 150 python3 benchmarks/profile_step.py --framework fuseflow --out "$res"
TAILN=16 run peers_fuseflow 150 python3 benchmarks/peers.py --worker fuseflow --out "$res" --quick --no-mnist
TAILN=16 run peers_jax 150 python3 benchmarks/peers.py --worker jax --out "$res" --quick --no-mnist
TAILN=20 run matmul_sweep 120 python3 benchmarks/matmul_sweep.py --out "$res" --models 784-1024-1024-10
