#!/usr/bin/env bash
# Seventeenth session, call 80: the batch copied in by the graph's own first node
# (repointed before each launch) against copies before the launch, with and without the
# DRELU tail in the kernel (step_overhead_probe, two alternating batches), the timeline at
# the new defaults, and the tests of the changed code.
# Results: $OUT/results-s20c.tgz.
set -uo pipefail
TAG=s20c
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run pytest_changed 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_compile.py tests/test_drelu_tail.py tests/test_fused_optim.py
TAILN=6 run step_overhead_probe 200 python3 benchmarks/step_overhead_probe.py --out "$res"
TAILN=3 run profile 90 python3 benchmarks/profile_step.py --framework fuseflow --out "$res" --tag "$TAG" \
  --configs 784-1024-1024-10:sgd:fp32,784-1024-1024-10:adam:fp32,784-30-10:sgd:fp32
