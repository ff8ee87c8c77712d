#!/usr/bin/env bash
# Eighteenth session, call 85: the seventeenth session's review fixes on the GPU (what
# device_session20h.sh was written for: float16's 16-load DRELU tail and float64's second
# launch, the tail across calls with fresh data, a true swap of donated leaves, the L2
# setting), the backend's own-epilog input gradients, the medium steps in the probe, and
# timelines of the medium Adam and the large 16-bit Adam steps (where the update could
# overlap the last weight gradient). Results: $OUT/results-s21a.tgz.
set -uo pipefail
TAG=s21a
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run pytest_fixes 300 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_drelu_tail.py tests/test_compile.py tests/test_train.py tests/test_k_split.py
TAILN=8 run pytest_dgrad 240 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_gpu_backend.py -k "dgrad or drelu or own_epilog"
TAILN=12 run step_overhead_probe 90 python3 benchmarks/step_overhead_probe.py --out "$res" \
  --data-dir .devdata/mnist --variants memcpy,in_graph+tail
TAILN=3 run profile 120 python3 benchmarks/profile_step.py --framework fuseflow --out "$res" --tag "$TAG" \
  --configs 784-1024-1024-10:adam:fp32,784-4096-4096-10:adam:16bit,784-4096-4096-10:sgd:16bit
