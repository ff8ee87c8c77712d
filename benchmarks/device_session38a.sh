#!/usr/bin/env bash
# Thirty-fifth session, first call: every GPU test on the thirty-fourth session's final tree
# (its last GPU runs covered only the files it touched), in the file groups of calls
# 141-143, 6 xdist workers each. test_kernel_sources.py (NVRTC only, no GPU) ran on the
# development machine instead. Results: $OUT/results-s38a.tgz.
set -uo pipefail
TAG=${TAG:-s38a}
source "$(dirname "$0")/_device_lib.sh"
n6="-n 6 --dist load"; python3 -c "import xdist" 2>/dev/null || n6=""
gpu_group() { local name=$1 limit=$2; shift 2
  TAILN=12 run "$name" "$limit" python3 -m pytest -m gpu -q -rfE -p no:cacheprovider $n6 "$@"; }
heavy="tests/test_gpu_backend.py tests/test_compile.py tests/test_checkpoint.py tests/test_drelu_tail.py"
gpu_group pytest_gpu_heavy 260 $heavy
gpu_group pytest_gpu_rest 260 tests --ignore=tests/test_kernel_sources.py \
  $(for f in $heavy; do echo "--ignore=$f"; done)
