#!/usr/bin/env bash
# Thirty-sixth session, call 170: every GPU test file but the kernel-source compile test on
# the session's final tree (the library as the thirty-fifth session left it, whose GPU
# runs covered the thirty-fourth session's tree and the files it touched), in the file
# groups of call 158, 6 xdist workers each. Results: $OUT/results-s39e.tgz.
set -uo pipefail
TAG=${TAG:-s39e}
source "$(dirname "$0")/_device_lib.sh"
gpu_groups 300 250
