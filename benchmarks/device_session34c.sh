#!/usr/bin/env bash
# Thirty-first session, for the next call (call 132 lost its machine; the session's device
# time then ran out): what no GPU has run yet. First the kept 3xTF32 form's own tests
# (every launch shape, the accuracy bound; calls 129-131 ran it as "tf32x3p" only through
# the probe, the sweeps and compiled steps) and the casts that keep float32/float64
# subnormals (ff_cast), with the probe once more; then every GPU test on the tree.
# Results: $OUT/results-s34d.tgz.
set -uo pipefail
TAG=s34d
source "$(dirname "$0")/_device_lib.sh"
TAILN=20 run pytest_new 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider $(xdist load) \
  tests/test_own_gemm.py tests/test_bfloat16.py -k "tf32x3 or f64_mma or casts"
TAILN=8 run tf32x3_probe 60 python3 benchmarks/tf32x3_probe.py --out "$res"
all_gpu_tests $((580 - SECONDS))
tar czf "$OUT/results-$TAG.tgz" -C "$res" .
