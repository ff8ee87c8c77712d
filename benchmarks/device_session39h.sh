#!/usr/bin/env bash
# Thirty-sixth session, call 173: TF32 bias/ReLU epilogs through the own pass (the own
# epilogs' "auto" mode now takes float32 with TF32 too). Every GPU test file but the
# kernel-source compile test (call 158's two groups), then fuseflow and JAX with TF32
# allowed, one process each. Results: $OUT/results-s39h.tgz.
set -uo pipefail
TAG=${TAG:-s39h}
source "$(dirname "$0")/_device_lib.sh"
n6="-n 6 --dist load"; python3 -c "import xdist" 2>/dev/null || n6=""
gpu_group() { local name=$1 limit=$2; shift 2
  TAILN=12 run "$name" "$limit" python3 -m pytest -m gpu -q -rfE -p no:cacheprovider $n6 "$@"; }
heavy="tests/test_gpu_backend.py tests/test_compile.py tests/test_checkpoint.py tests/test_drelu_tail.py"
gpu_group pytest_gpu_heavy 240 $heavy
gpu_group pytest_gpu_rest 150 tests --ignore=tests/test_kernel_sources.py \
  $(for f in $heavy; do echo "--ignore=$f"; done)
for w in fuseflow jax; do
  TAILN=8 peers "peers_$w" 100 --worker "$w" --tag "$TAG" --precisions tf32 --no-mnist
done
