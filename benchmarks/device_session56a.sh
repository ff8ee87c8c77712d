#!/usr/bin/env bash
# Fifty-third session, second call (after call 219 ran device_session55a.sh on an H100):
# that the device's tree generates the same kernel sources as the development machine's
# (tests/kernel_sources_digest.py, its SHA-256 printed), the GPU tests of the loss
# kernels whose softmax text moved into _cuda_fused.row_softmax_src, then the 16-bit
# share (interleaved_16bit.py) with the one-pass output layer off and on (warp roles),
# alternating processes, two of each. Results: $OUT/results-$TAG.tgz.
set -uo pipefail
TAG=${TAG:-s56b}
source "$(dirname "$0")/_device_lib.sh"
TAILN=3 run kernel_digest 60 bash -c "python3 tests/kernel_sources_digest.py | sha256sum"
TAILN=12 run pytest_loss_kernels 170 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  $(xdist load 4) tests/test_gpu_head.py tests/test_gpu_tc_xent.py tests/test_gpu_backend.py -k "xent or head"
for k in 1 2; do
  FUSEFLOW_FUSED_TC_HEAD=0 interleaved_16bit "interleaved_off_$k" 100 --tag "${TAG}_off_$k" --rounds 3 --window 1.5
  FUSEFLOW_FUSED_TC_HEAD=1 interleaved_16bit "interleaved_roles_$k" 100 --tag "${TAG}_roles_$k" --rounds 3 --window 1.5
done
