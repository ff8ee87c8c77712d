#!/usr/bin/env bash
# Fifty-first session: the first GPU run of the one-pass output layer (_cuda_tc_head: logits,
# loss and both gradients in one cluster launch, x read once). Its GPU tests (and the
# two-kernel path's), the kernel alone against the two kernels over cluster counts, the
# compiled 16-bit large steps with it off and on side by side (settings_ab.py, SGD and Adam,
# three rounds), the step's kernel profile with it on, then one interleaved_16bit.py process
# and a peers.py 16-bit pair with it on. On an H200 the whole matrix (defaults) follows.
# Stops after the sweep if the large shape's exact test fails. Results: $OUT/results-$TAG.tgz.
set -uo pipefail
TAG=${TAG:-s54b}
source "$(dirname "$0")/_device_lib.sh"
TAILN=25 run pytest_tc_head 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_gpu_tc_head.py tests/test_gpu_tc_xent.py
TAILN=12 run tc_head_sweep 60 python3 benchmarks/tc_head_sweep.py --out "$res" --tag "$TAG"
if grep -q "FAILED.*8192x4096x10" "$res/pytest_tc_head.log"; then echo "the large shape failed: stopping"; exit 0; fi
ab tc_head 240 3 fused_tc_head=0 fused_tc_head=1
FUSEFLOW_FUSED_TC_HEAD=1 TAILN=4 run profile_head 60 python3 benchmarks/profile_step.py \
  --framework fuseflow --out "$res" --tag "${TAG}_head" --configs 784-4096-4096-10:adam:16bit
FUSEFLOW_FUSED_TC_HEAD=1 interleaved_16bit interleaved_head 150 --tag "${TAG}_head" \
  --rounds 3 --window 1.5
FUSEFLOW_FUSED_TC_HEAD=1 pair_16bit 45
if grep -q H200 "$res/env.txt"; then whole_matrix; fi
