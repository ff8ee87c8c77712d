#!/usr/bin/env bash
# Thirty-second session: what no GPU has run yet, as device_session34c.sh (which call 132
# did not finish), fitted to the device time left: the kept 3xTF32 form's own tests and
# the subnormal-keeping casts first, then every GPU test within LIMIT seconds of the
# script's start (default 560; the probe of 34c is left out: call 129 ran it on this
# form). Results: $OUT/results-s35a.tgz.
set -uo pipefail
TAG=s35a
LIMIT=${LIMIT:-560}
source "$(dirname "$0")/_device_lib.sh"
TAILN=20 run pytest_new 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider $(xdist load) \
  tests/test_own_gemm.py tests/test_bfloat16.py -k "tf32x3 or f64_mma or casts"
all_gpu_tests $((LIMIT - SECONDS))
