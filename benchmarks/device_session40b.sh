#!/usr/bin/env bash
# Thirty-seventh session, for a short device budget: device_session40a.sh's checks of what
# changed (the GPU backend tests with the TF32 own-epilog default and the own GELU epilogs,
# the layers, K-split and compile tests) and its GELU measurements (gelu_epilog_probe.py,
# fuseflow and JAX with GELU hidden layers in float32 and TF32). Results:
# $OUT/results-s40b.tgz.
set -uo pipefail
TAG=${TAG:-s40b}
source "$(dirname "$0")/_device_lib.sh"
n6="-n 6 --dist load"; python3 -c "import xdist" 2>/dev/null || n6=""
TAILN=12 run pytest_gpu_changed 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider $n6 \
  tests/test_gpu_backend.py tests/test_gpu_layers.py tests/test_k_split.py tests/test_compile.py
TAILN=60 run gelu_epilog_probe 80 python3 benchmarks/gelu_epilog_probe.py --out "$res"
for w in fuseflow jax; do
  TAILN=8 peers "peers_gelu_$w" 80 --worker "$w" --tag "${TAG}_gelu" --precisions fp32,tf32 \
    --activation gelu --no-mnist
done
