#!/usr/bin/env bash
# Thirty-fourth session, the final tree: the GPU tests of the files its last commits touched
# (compute_copy, the CLI's --loss-scaling with its GPU run in bfloat16 both ways, the
# split update, mixed precision, the fused optimizers, training, the CLI, compile).
# Limit 450 s for the tests (a fresh machine: about 30 s of the device time go to its start).
# Results: $OUT/results-s37f.tgz.
set -uo pipefail
TAG=${TAG:-s37f}
source "$(dirname "$0")/_device_lib.sh"
TAILN=15 run pytest_gpu_final 450 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  $(xdist load) tests/test_bfloat16.py tests/test_split_update.py tests/test_mixed_precision.py \
  tests/test_mixed_precision_audit.py tests/test_fused_optim.py tests/test_train.py \
  tests/test_cli.py tests/test_run_guards.py tests/test_overlap.py tests/test_compile.py \
  tests/test_compile_cast.py tests/test_optim_compile_audit.py
