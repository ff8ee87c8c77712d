#!/usr/bin/env bash
# Twenty-seventh session's short call, for what device time was left after eleven calls
# that found no machine: the twenty-fifth session's new GPU tests (device_session28a.sh's
# first step), then fuseflow against JAX on the 16-bit large model (device_session28b.sh's
# first two steps: the Adam step's share of JAX's bf16 8192^3 matmul, target 80%).
# Results: $OUT/results-s30a.tgz.
set -uo pipefail
TAG=s30a
source "$(dirname "$0")/_device_lib.sh"
TAILN=10 run pytest_new 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_compile_cast.py tests/test_gpu_tc_xent.py tests/test_fused_optim.py \
  tests/test_compile.py -k "cast or batch or copies or copy or xent or skip or inverse or scal"
TAILN=4 peers peers_fuseflow_large 110 --worker fuseflow --tag s30a_large \
  --models 784-4096-4096-10 --precisions 16bit --no-mnist
TAILN=4 peers peers_jax_large 140 --worker jax --tag s30a_large \
  --models 784-4096-4096-10 --precisions 16bit --no-mnist
