#!/usr/bin/env bash
# Twentieth session, call 107: an input gradient's plain matmul in its two operand
# orientations (orientation_probe.py: w.T @ dy.T, the backend's, against dy @ w), 16-bit,
# full float32 and TF32, the large and the medium model's hidden layer; the compiled large
# steps with FUSEFLOW_DGRAD_ORIENTATION nn and tt side by side (settings_ab.py). The
# backend's tests with dgrad_orientation "tt" (a fourth backend fixture) run in
# device_session24a.sh, which goes first (the twenty-second session moved them there: the
# four steps' limits came to 720 s, over the 600 s a call may take). Results:
# $OUT/results-s23d.tgz.
set -uo pipefail
TAG=s23d
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run orientation_probe 120 python3 benchmarks/orientation_probe.py --out "$res" --rounds 3
TAILN=6 run ab_orient_16bit 150 python3 benchmarks/settings_ab.py --out "$res" --name dgrad_orientation_16bit \
  --setting dgrad_orientation=nn --setting dgrad_orientation=tt --rounds 3
TAILN=6 run ab_orient_fp32 150 python3 benchmarks/settings_ab.py --out "$res" --name dgrad_orientation_fp32 \
  --setting dgrad_orientation=nn --setting dgrad_orientation=tt --rounds 2 --steps 10 \
  --config 784-4096-4096-10:adam:fp32 --config 784-4096-4096-10:adam:tf32
