#!/usr/bin/env bash
# Twentieth session, call 105: every GPU test again (call 104's run lost one pytest-xdist
# worker to a numpy.float64 junit property, fixed) with the new ReLU-mask pass and its
# tests, then the pass against cuBLASLt's mask epilog in 16-bit forwards and compiled steps
# (relu_mask_probe.py, 3 rounds). Results: $OUT/results-s23b.tgz. The pass, its tests and
# the probe were reverted after this call (no faster); they are in commit f3b6ec4.
set -uo pipefail
TAG=s23b
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_relu_mask 90 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_relu_mask.py
TAILN=6 run relu_mask_probe 150 python3 benchmarks/relu_mask_probe.py --out "$res" --rounds 3
TAILN=25 run pytest_gpu_all 400 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  -n 4 --dist loadfile tests --ignore=tests/test_kernel_sources.py
