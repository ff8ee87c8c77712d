#!/usr/bin/env bash
# Twenty-fifth session's third call, prepared without a device: every GPU test on the tree
# (the one-pass output-layer gradients' fixed test among them: call 116's CuPy-reference
# slip), then device_session27c.sh's pieces that did not run in the twenty-fourth session,
# on top of this session's changes: the compiled 16-bit steps with the one pass on and off
# (6 alternating rounds) and the kernels over launch shapes. Results: $OUT/results-s28c.tgz.
set -uo pipefail
TAG=s28c
source "$(dirname "$0")/_device_lib.sh"
all_gpu_tests 240
ab fused_grads 180 6 fused_skinny_grads=True fused_skinny_grads=False
TAILN=12 run skinny_sweep_tc 50 python3 benchmarks/skinny_sweep.py --out "$res" --only tc
