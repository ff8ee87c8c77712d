#!/usr/bin/env bash
# Twenty-first session's script (no device was lent in that session; ready for the next):
# every GPU test on the twentieth and twenty-first sessions' code, which no GPU has run
# (OverlapScope.join's single capture_info query, the shared compiled-step helper of the
# split/overlap/random-bits tests, dgrad_orientation "tt" as a fourth backend fixture, the
# tensor-core skinny kernels at 8 warps and 1/4 unrolled k16 steps), four pytest-xdist
# workers; then the float16 output layer's tensor-core kernels over rows per chunk, warps
# per block and unrolled steps (skinny_sweep.py --only tc). Run device_session23d.sh
# (call 107: the operand orientation's timings) after it. Results: $OUT/results-s24a.tgz.
set -uo pipefail
TAG=s24a
source "$(dirname "$0")/_device_lib.sh"
TAILN=25 run pytest_gpu_all 420 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  $(xdist loadfile) tests --ignore=tests/test_kernel_sources.py
TAILN=40 run skinny_sweep_tc 150 python3 benchmarks/skinny_sweep.py --out "$res" --only tc
