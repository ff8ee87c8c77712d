#!/usr/bin/env bash
# Twenty-fourth session, call 116: the float16 output layer's weight and input gradients
# in one tensor-core pass (linear_grads -> _cuda_skinny_tc.grads). Its GPU tests; the
# kernels over launch shapes beside the two separate ones (skinny_sweep.py --only tc); the
# compiled 16-bit steps with the pass on and off (settings_ab.py, 5 alternating rounds);
# the 16-bit Adam step's timeline with it; then every GPU test. Results: $OUT/results-s27b.tgz.
set -uo pipefail
TAG=s27b
source "$(dirname "$0")/_device_lib.sh"
TAILN=15 run pytest_grads 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_gpu_backend.py -k "skinny_tc or linear_grads or one_pass"
TAILN=12 run skinny_sweep_tc 100 python3 benchmarks/skinny_sweep.py --out "$res" --only tc
TAILN=6 run ab_fused_grads 150 python3 benchmarks/settings_ab.py --out "$res" --name fused_grads \
  --setting fused_skinny_grads=True --setting fused_skinny_grads=False --rounds 5
TAILN=3 run profile_16bit 60 python3 benchmarks/profile_step.py --framework fuseflow \
  --out "$res" --tag s27b --configs 784-4096-4096-10:adam:16bit
TAILN=25 run pytest_gpu_all 240 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  $(xdist load) tests --ignore=tests/test_kernel_sources.py
