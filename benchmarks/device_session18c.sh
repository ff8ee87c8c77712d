#!/usr/bin/env bash
# The fifteenth session's third call: the own matmul's fixed cost against its cost per
# k-tile (gemm_kscan.py: K from 16 to 1024, one block per tile), next to the cuBLASLt path
# and an empty kernel; and the float64 form's tests after the cluster test's fix (bk=32
# with 3 splits). Results: $OUT/results-s18c.tgz.
set -uo pipefail
TAG=s18c
source "$(dirname "$0")/_device_lib.sh"
TAILN=40 run gemm_kscan 120 python3 benchmarks/gemm_kscan.py --out "$res"
TAILN=6 run pytest_f64 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_own_gemm.py -k f64
