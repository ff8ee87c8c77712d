#!/usr/bin/env bash
# The sixteenth session's seventh call: the last commits' changes on the GPU: the K-split
# tests (new skip guard), the kernel-source test (now marked gpu), and both probes after
# their step loop moved to peers.compiled_step_us (one round each). Results:
# $OUT/results-s19g.tgz.
set -uo pipefail
TAG=s19g
source "$(dirname "$0")/_device_lib.sh"
ls -d /usr/local/cuda*/include 2>&1 | head -3 > "$res/cuda_include.txt"
TAILN=6 run pytest_changed 300 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider \
  tests/test_k_split.py tests/test_kernel_sources.py
TAILN=12 run splitk_probe 120 python3 benchmarks/splitk_probe.py --out "$res" --rounds 1
TAILN=6 run update_probe 90 python3 benchmarks/update_probe.py --out "$res" --rounds 1
