#!/usr/bin/env bash
# Ran as call 167 on commit 34bf728 (early_update_after, reverted after it).
# Thirty-sixth session, second call: the multi-tensor update's grid capped
# (_cuda_fused.BLOCKS_PER_SM; uncapped by default) with the side stream's early update
# waiting for the input gradient's matmul ("product") or its ReLU-gradient pass too
# ("epilog", the default): call 166 found "product" 11% slower on medium Adam, the side
# update's 4,100 blocks filling the SMs before layer 1's weight gradient. The small and
# medium fp32 compiled steps side by side (settings_ab.py, 4 rounds). Results:
# $OUT/results-s39b.tgz.
set -uo pipefail
TAG=${TAG:-s39b}
source "$(dirname "$0")/_device_lib.sh"
cap=_cuda_fused.BLOCKS_PER_SM
TAILN=14 run ab_update_cap 300 python3 benchmarks/settings_ab.py --out "$res" \
  --name update_cap --setting early_update_after=epilog \
  --setting early_update_after=product,$cap=1 --setting early_update_after=product,$cap=2 \
  --setting early_update_after=product,$cap=4 --setting early_update_after=epilog,$cap=1 \
  --setting early_update_after=epilog,$cap=4 \
  --config 784-1024-1024-10:sgd:fp32 --config 784-1024-1024-10:adam:fp32 \
  --config 784-30-10:sgd:fp32 --config 784-30-10:adam:fp32 --rounds 4
TAILN=3 run profile_product_cap2 90 env FUSEFLOW_EARLY_UPDATE_AFTER=product \
  python3 - <<'PY'
import runpy, sys
from fuseflow.backend import _cuda_fused
_cuda_fused.BLOCKS_PER_SM = 2
sys.argv = ["profile_step.py", "--framework", "fuseflow", "--out", "/tmp/ffres-s39b",
            "--tag", "s39b_product_cap2", "--configs", "784-1024-1024-10:adam:fp32"]
runpy.run_path("benchmarks/profile_step.py", run_name="__main__")
PY
