#!/usr/bin/env bash
# Written in the fifty-second session (not run: its device time ran out; call 218 ran
# device_session55c.sh, its first half): the one-pass output layer's three forms (the
# whole cluster barrier, the barrier split in two, warp roles: a push and a loss warp
# beside the eight feature warps, the default form since call 218). Its GPU tests in
# every form and the kernel alone (device_session55c.sh), then the compiled 16-bit large
# steps: head off, on whole, on split, on with roles (three rounds). Results:
# $OUT/results-$TAG.tgz.
set -uo pipefail
TAG=${TAG:-s55b}
source "$(dirname "$0")/device_session55c.sh"  # the tests and the sweep (call 218's)
ab tc_head 230 3 fused_tc_head=0 "fused_tc_head=1,_cuda_tc_head.ROLES=False" \
  "fused_tc_head=1,_cuda_tc_head.ROLES=False,_cuda_tc_head.SPLIT_BARRIER=True" fused_tc_head=1
# if warp roles beat the two kernels alone, the 16-bit share with them on (one process,
# as calls 212-213) and a peers.py pair
if python3 - "$res/tc_head_sweep_$TAG.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
two = rows[0]["us"]
roles = [r["us"] for r in rows if r.get("form") == "roles"]
sys.exit(0 if roles and min(roles) < two else 1)
PY
then
  export FUSEFLOW_FUSED_TC_HEAD=1
  interleaved_16bit interleaved_roles 150 --tag "${TAG}_roles" --rounds 3 --window 1.5
  pair_16bit 45
fi
