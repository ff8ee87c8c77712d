#!/usr/bin/env bash
# The sixteenth session's sixth call: the GPU tests that call 75 did not reach before its
# 450 s limit (it stopped at 92% with none failed: the rest of test_own_gemm.py and the
# training tests), then fuseflow and JAX once more on every model (a second sample of the
# pair; no time to 98%). Results: $OUT/results-s19f.tgz.
set -uo pipefail
TAG=s19f
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu_tail 280 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_own_gemm.py tests/test_train.py tests/test_train_cli_audit.py
TAILN=4 peers peers_fuseflow 60 --no-mnist --worker fuseflow --tag s19f
TAILN=4 peers peers_jax 150 --no-mnist --worker jax --tag s19f
