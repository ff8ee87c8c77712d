#!/usr/bin/env bash
# Thirty-sixth session, call 173 (a shorter device_session39h.sh for the 304 s left after a
# start that failed): the GPU tests that take TF32 (-k tf32) and the K-split and overlap
# files, then fuseflow and JAX with TF32 allowed, one process each. Results:
# $OUT/results-s39i.tgz.
set -uo pipefail
TAG=${TAG:-s39i}
source "$(dirname "$0")/_device_lib.sh"
n6="-n 6 --dist load"; python3 -c "import xdist" 2>/dev/null || n6=""
TAILN=8 run pytest_tf32 60 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider $n6 \
  tests/test_gpu_backend.py tests/test_overlap.py tests/test_own_gemm.py -k tf32
TAILN=8 run pytest_ksplit_overlap 60 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  $n6 tests/test_k_split.py tests/test_overlap.py
for w in fuseflow jax; do
  TAILN=8 peers "peers_$w" 70 --worker "$w" --tag "$TAG" --precisions tf32 --no-mnist
done
