#!/usr/bin/env bash
# The sixteenth session's first call: fuseflow's own K split (CudaBackend.k_splits: one
# strided-batched cuBLASLt matmul for the K slices' partial products, added by the epilog
# pass) against cuBLASLt's split-K kernel + reduction + epilog: its tests, the per-matmul
# and compiled-step probe (splitk_probe.py), and profiles of the medium steps with and
# without it. Results: $OUT/results-s19a.tgz.
set -uo pipefail
TAG=s19a
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run pytest_k_split 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_k_split.py tests/test_gpu_backend.py -k "k_split or forward or dgrad or chain"
TAILN=40 run splitk_probe 240 python3 benchmarks/splitk_probe.py --out "$res"
for r in 1 2; do for s in 0 4; do
  TAILN=3 run "profile_k${s}_$r" 90 env FUSEFLOW_K_SPLITS=$s python3 benchmarks/profile_step.py \
    --framework fuseflow --out "$res" --tag "${TAG}_k${s}_$r" \
    --configs "784-1024-1024-10:sgd:fp32,784-1024-1024-10:adam:fp32"
done; done
