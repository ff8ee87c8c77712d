#!/usr/bin/env bash
# Fortieth session, first call: the pipelined 3xTF32 probe (tf32x3_pipe_probe.py, 3xTF32
# and plain TF32 over its six tiles and four K splits at the medium model's five matmuls),
# then every GPU test but the kernel sources' on the thirty-ninth session's final tree
# (device_session42d.sh's first half). Results: $OUT/results-s43a.tgz.
set -uo pipefail
TAG=${TAG:-s43a}
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run tf32x3_pipe 150 python3 benchmarks/tf32x3_pipe_probe.py --out "$res" --products 3 1
gpu_groups 260 130
