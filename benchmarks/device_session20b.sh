#!/usr/bin/env bash
# Seventeenth session, call 79: the batch-copy kernel, the DRELU bias-gradient tail in the
# kernel, and the fork order, each on and off in the compiled steps (step_overhead_probe),
# the timeline at the new defaults, and the tests of the changed code.
# Results: $OUT/results-s20b.tgz.
set -uo pipefail
TAG=s20b
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run pytest_changed 300 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_drelu_tail.py tests/test_compile.py tests/test_k_split.py tests/test_kernel_sources.py
TAILN=6 run step_overhead_probe 200 python3 benchmarks/step_overhead_probe.py --out "$res"
TAILN=3 run profile 90 python3 benchmarks/profile_step.py --framework fuseflow --out "$res" --tag "$TAG" \
  --configs 784-1024-1024-10:sgd:fp32,784-1024-1024-10:adam:fp32,784-30-10:sgd:fp32
