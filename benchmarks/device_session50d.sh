#!/usr/bin/env bash
# Forty-seventh session, last call: after the in-place one-slice epilogs (call 203 ran the
# kernel's tests and the heavy group), the rest of the GPU tests (call 158's second group)
# and the CLI on the GPU in float32 and float16, with the defaults ("3xtf32-lotrunc").
# Results: $OUT/results-s50d.tgz.
set -uo pipefail
TAG=${TAG:-s50d}
source "$(dirname "$0")/_device_lib.sh"
gpu_rest 130
cli_runs 30
