#!/usr/bin/env bash
# Thirty-fifth session, first call: every GPU test on the thirty-fourth session's final tree
# (its last GPU runs covered only the files it touched), in the file groups of calls
# 141-143, 6 xdist workers each. test_kernel_sources.py (NVRTC only, no GPU) ran on the
# development machine instead. Results: $OUT/results-s38a.tgz.
set -uo pipefail
TAG=${TAG:-s38a}
source "$(dirname "$0")/_device_lib.sh"
gpu_groups 260 260
