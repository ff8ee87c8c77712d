#!/usr/bin/env bash
# Thirty-seventh session: device_session39h.sh (every GPU test file but the kernel-source
# compile test, in call 158's two groups, on the tree with the TF32 own-epilog default and
# the own GELU epilogs), what cuBLASLt's and the own GELU/ReLU epilogs cost over a plain
# matmul (gelu_epilog_probe.py), fuseflow and JAX with TF32 allowed, then both with GELU
# hidden layers in float32 and TF32; one process each. Results: $OUT/results-s40a.tgz.
set -uo pipefail
TAG=${TAG:-s40a}
source "$(dirname "$0")/_device_lib.sh"
gpu_groups 220 130
TAILN=60 run gelu_epilog_probe 90 python3 benchmarks/gelu_epilog_probe.py --out "$res"
for w in fuseflow jax; do
  TAILN=8 peers "peers_$w" 80 --worker "$w" --tag "$TAG" --precisions tf32 --no-mnist
done
for w in fuseflow jax; do
  TAILN=8 peers "peers_gelu_$w" 90 --worker "$w" --tag "${TAG}_gelu" --precisions fp32,tf32 \
    --activation gelu --no-mnist
done
