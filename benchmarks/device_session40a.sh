#!/usr/bin/env bash
# Thirty-seventh session: device_session39h.sh (every GPU test file but the kernel-source
# compile test, in call 158's two groups, on the tree with the TF32 own-epilog default;
# then fuseflow and JAX with TF32 allowed, one process each), then what cuBLASLt's GELU and
# ReLU epilogs cost over a plain matmul (gelu_epilog_probe.py). Results:
# $OUT/results-s40a.tgz.
set -uo pipefail
TAG=${TAG:-s40a}
source "$(dirname "$0")/_device_lib.sh"
TAILN=40 run gelu_epilog_probe 120 python3 benchmarks/gelu_epilog_probe.py --out "$res"
gpu_groups 240 150
for w in fuseflow jax; do
  TAILN=8 peers "peers_$w" 90 --worker "$w" --tag "$TAG" --precisions tf32 --no-mnist
done
