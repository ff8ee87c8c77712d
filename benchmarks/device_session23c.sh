#!/usr/bin/env bash
# Twentieth session, call 106: the float16 output layer's weight gradient overlapped beside
# its input gradient (both _cuda_skinny_tc's memory-bound kernels; overlap_skinny_tc):
# the overlap tests, the 16-bit compiled steps with it off and on (settings_ab.py, 3
# rounds), and a kernel timeline of the 16-bit Adam step each way. Results:
# $OUT/results-s23c.tgz. The overlap measured slower and was reverted; its code and test
# are in commit 8be9bc4.
set -uo pipefail
TAG=s23c
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_overlap 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_overlap.py tests/test_split_update.py
TAILN=8 run ab_skinny_tc 200 python3 benchmarks/settings_ab.py --out "$res" \
  --name overlap_skinny_tc --setting overlap_skinny_tc=0 --setting overlap_skinny_tc=1 --rounds 3
for v in 0 1; do
  FUSEFLOW_OVERLAP_SKINNY_TC=$v TAILN=3 run "profile_tc$v" 90 python3 benchmarks/profile_step.py \
    --framework fuseflow --out "$res" --tag "s23c_tc$v" --configs 784-4096-4096-10:adam:16bit
done
