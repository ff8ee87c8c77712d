#!/usr/bin/env bash
# The session's last call: the GPU tests the verification call's time limit cut off (the
# own matmul's, the fit and overlap tests), the overlap/data/compile tests again after the
# overlap's byte cap, and fuseflow's medium and large steps with their compiled pools.
# Results: $OUT/results-s6b.tgz.
set -uo pipefail
TAG=s6b
source "$(dirname "$0")/_device_lib.sh"
TAILN=10 run pytest_rest 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_own_gemm.py tests/test_train.py tests/test_overlap.py tests/test_data.py tests/test_compile.py
TAILN=12 run peers_fuseflow 80 python3 benchmarks/peers.py --worker fuseflow --out "$res" --no-mnist --models 784-1024-1024-10,784-4096-4096-10 --tag cap
