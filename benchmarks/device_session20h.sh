#!/usr/bin/env bash
# Prepared in the seventeenth session, not run (its device time ran out): the tests of the
# review fixes made after call 84 (float16's 16-load DRELU tail and float64's second
# launch, the tail across calls with fresh data, a true swap of donated leaves, the L2
# setting's "auto"), the backend's own-epilog input gradients in every dtype, and the
# medium steps once more. Results: $OUT/results-s20h.tgz.
set -uo pipefail
TAG=s20h
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run pytest_fixes 300 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_drelu_tail.py tests/test_compile.py tests/test_train.py tests/test_k_split.py
TAILN=8 run pytest_dgrad 300 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_gpu_backend.py -k "dgrad or drelu or own_epilog"
TAILN=12 run step_overhead_probe 90 python3 benchmarks/step_overhead_probe.py --out "$res" \
  --data-dir .devdata/mnist --variants memcpy,in_graph+tail
