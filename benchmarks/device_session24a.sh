#!/usr/bin/env bash
# Twenty-first session's script (no device was lent in that session; ready for the next):
# every GPU test on the twentieth and twenty-first sessions' code, which no GPU has run
# (OverlapScope.join's single capture_info query, the shared compiled-step helper of the
# split/overlap/random-bits tests, dgrad_orientation "tt" as a fourth backend fixture, the
# tensor-core skinny kernels at 8 warps and 1/4 unrolled k16 steps), four pytest-xdist
# workers; then the float16 output layer's tensor-core kernels over rows per chunk, warps
# per block and unrolled steps (skinny_sweep.py --only tc), and its fastest shape against
# the defaults in the compiled 16-bit steps (settings_ab.py). Run device_session23d.sh
# (call 107: the operand orientation's timings) after it. Results: $OUT/results-s24a.tgz.
# Limits (580 s in all, under a call's 600): the tests ran 294 s on a fresh machine in call
# 104 (3,363 of them, --dist loadfile: test_gpu_backend.py on one worker) and now number
# about 4,050 (test_gpu_backend.py 2,197 -> 2,884 with the "tt" fixture), so they are
# spread test by test (--dist load, as call 107's backend tests were to be); call 106's
# settings_ab.py of the same 12 compiled steps took 30 s.
set -uo pipefail
TAG=s24a
source "$(dirname "$0")/_device_lib.sh"
TAILN=25 run pytest_gpu_all 390 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  $(xdist load) tests --ignore=tests/test_kernel_sources.py
TAILN=40 run skinny_sweep_tc 100 python3 benchmarks/skinny_sweep.py --out "$res" --only tc
# the sweep's fastest launch shape against the defaults in the compiled 16-bit steps
best=$(python3 benchmarks/skinny_sweep.py --print-best "$res/skinny_sweep_tc.json") && \
  TAILN=6 run ab_tc_launch 90 python3 benchmarks/settings_ab.py --out "$res" --name tc_launch \
  --setting "_cuda_skinny_tc.ROWS_PER_CHUNK=512,_cuda_skinny_tc.GRAD_WARPS=4,_cuda_skinny_tc.GRAD_UNROLL=2" \
  --setting "$best" --rounds 3
