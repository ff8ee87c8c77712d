#!/usr/bin/env bash
# Thirty-sixth session, call 170: every GPU test file but the kernel-source compile test on
# the session's final tree (the library as the thirty-fifth session left it, whose GPU
# runs covered the thirty-fourth session's tree and the files it touched), in the file
# groups of call 158, 6 xdist workers each. Results: $OUT/results-s39e.tgz.
set -uo pipefail
TAG=${TAG:-s39e}
source "$(dirname "$0")/_device_lib.sh"
n6="-n 6 --dist load"; python3 -c "import xdist" 2>/dev/null || n6=""
gpu_group() { local name=$1 limit=$2; shift 2
  TAILN=12 run "$name" "$limit" python3 -m pytest -m gpu -q -rfE -p no:cacheprovider $n6 "$@"; }
heavy="tests/test_gpu_backend.py tests/test_compile.py tests/test_checkpoint.py tests/test_drelu_tail.py"
gpu_group pytest_gpu_heavy 300 $heavy
gpu_group pytest_gpu_rest 250 tests --ignore=tests/test_kernel_sources.py \
  $(for f in $heavy; do echo "--ignore=$f"; done)
