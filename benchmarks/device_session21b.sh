#!/usr/bin/env bash
# Eighteenth session, call 86: cuBLASLt's captured memsets replayed as fill kernels
# (_cuda_graph_memsets): the tests, then the large model's 16-bit steps with the rewrite
# off ("keep") and on ("kernel"), alternating, two rounds (timelines: the gaps before the
# four big matmuls). Results: $OUT/results-s21b.tgz.
set -uo pipefail
TAG=s21b
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run pytest_memsets 240 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_graph_memsets.py tests/test_compile.py
for r in 1 2; do for v in keep kernel; do
  FUSEFLOW_GRAPH_MEMSETS=$v TAILN=3 run "profile_${v}_$r" 90 python3 benchmarks/profile_step.py \
    --framework fuseflow --out "$res" --tag "${TAG}_${v}_$r" \
    --configs 784-4096-4096-10:adam:16bit,784-4096-4096-10:sgd:16bit,784-1024-1024-10:sgd:fp32
done; done
