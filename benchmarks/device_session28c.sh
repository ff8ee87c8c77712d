#!/usr/bin/env bash
# Twenty-fifth session's third call, prepared without a device: the one-pass output-layer
# gradients (device_session27c.sh's pieces, not run in the twenty-fourth session) on top of
# the batch cast: their GPU tests (call 116's new backend test fixed: a CuPy reference),
# the compiled 16-bit steps with the pass on and off (6 alternating rounds), the kernels
# over launch shapes, then every GPU test. Results: $OUT/results-s28c.tgz.
set -uo pipefail
TAG=s28c
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run pytest_grads 120 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_gpu_backend.py -k "linear_grads or one_pass or exact_on_integers"
ab fused_grads 180 6 fused_skinny_grads=True fused_skinny_grads=False
TAILN=12 run skinny_sweep_tc 50 python3 benchmarks/skinny_sweep.py --out "$res" --only tc
all_gpu_tests 240
