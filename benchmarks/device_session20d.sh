#!/usr/bin/env bash
# Seventeenth session, call 81: the step probe once more (the DRELU tail's loads issued
# together) with MNIST epochs, every GPU test but the kernel-source one (which ran on the
# final sources on the CPU machine with NVRTC).
# Results: $OUT/results-s20d.tgz.
set -uo pipefail
TAG=s20d
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run step_overhead_probe 90 python3 benchmarks/step_overhead_probe.py --out "$res" --data-dir .devdata/mnist
TAILN=12 run pytest_gpu 420 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests \
  --ignore=tests/test_kernel_sources.py
