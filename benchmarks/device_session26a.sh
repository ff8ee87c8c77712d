#!/usr/bin/env bash
# Twenty-third session, call 112: stream priorities in compiled steps (the capture stream's
# kernels at the device's highest priority, "main"; the side streams', "side"; one for all,
# "off"). Tests of compile, overlap, the split update and the priorities, then the settings
# side by side in compiled fp32 steps, with and without the early update waiting only for
# the input gradient's matmul (update_after_product), then timelines of the medium steps under each
# policy. Results: $OUT/results-s26a.tgz (call 113 ran it as s26b, after the fix that really
# instantiates with node priorities). Measured no faster; the code it ran is commit c34c244,
# reverted after it (docs/benchmarks-log.md, "The twenty-third session").
set -uo pipefail
TAG=s26a
source "$(dirname "$0")/_device_lib.sh"
TAILN=15 run tests_priority 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider $(xdist load) \
  tests/test_stream_priority.py tests/test_compile.py tests/test_split_update.py tests/test_overlap.py \
  "tests/test_gpu_backend.py::test_own_gelu_grad_beyond_the_largest_finite_square"
TAILN=40 run ab_priority 220 python3 benchmarks/settings_ab.py --out "$res" --name priority --rounds 5 \
  --setting _cuda_overlap.PRIORITY=off,update_after_product=False \
  --setting _cuda_overlap.PRIORITY=off,update_after_product=True \
  --setting _cuda_overlap.PRIORITY=main,update_after_product=True \
  --setting _cuda_overlap.PRIORITY=side,update_after_product=True \
  --setting _cuda_overlap.PRIORITY=main,update_after_product=False \
  --config 784-1024-1024-10:sgd:fp32 --config 784-1024-1024-10:adam:fp32 \
  --config 784-30-10:sgd:fp32 --config 784-30-10:adam:fp32
for p in off main side; do
  FUSEFLOW_STREAM_PRIORITY=$p TAILN=3 run "profile_$p" 50 python3 benchmarks/profile_step.py \
    --framework fuseflow --out "$res" --tag "${TAG}_$p" \
    --configs 784-1024-1024-10:sgd:fp32,784-1024-1024-10:adam:fp32
done
