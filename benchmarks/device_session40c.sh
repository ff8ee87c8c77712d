#!/usr/bin/env bash
# Thirty-seventh session, after call 174: the own GELU pass kept for DGELU only (cuBLASLt's
# GELU forwards were as fast, gelu_epilog_probe.py). The GPU tests that take GELU or the
# own epilogs, the probe again, and fuseflow and JAX with GELU hidden layers in float32 and
# TF32.
# Results: $OUT/results-s40c.tgz.
set -uo pipefail
TAG=${TAG:-s40c}
source "$(dirname "$0")/_device_lib.sh"
n6="-n 6 --dist load"; python3 -c "import xdist" 2>/dev/null || n6=""
TAILN=12 run pytest_gelu 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider $n6 \
  tests/test_gpu_backend.py tests/test_gpu_layers.py tests/test_k_split.py -k "gelu or GELU or own"
TAILN=60 run gelu_epilog_probe 60 python3 benchmarks/gelu_epilog_probe.py --out "$res" \
  --precisions float32 tf32
TAILN=14 peers peers_gelu_fuseflow 60 --worker fuseflow --tag "${TAG}_gelu" \
  --precisions fp32,tf32 --activation gelu --no-mnist
TAILN=14 peers peers_gelu_jax 70 --worker jax --tag "${TAG}_gelu" \
  --precisions fp32,tf32 --activation gelu --no-mnist
