#!/usr/bin/env bash
# Forty-first session: the wgmma 3xTF32 probe (benchmarks/wgmma_probe.py): its layout and
# fragment checks, then the five medium products over tiles, K splits, one or three TF32
# products and both sum modes, against cuBLASLt's float32 and TF32.
# Results: $OUT/results-s44a.tgz.
set -uo pipefail
TAG=${TAG:-s44a}
source "$(dirname "$0")/_device_lib.sh"
TAILN=30 run wgmma_probe 420 python3 benchmarks/wgmma_probe.py --out "$res" ${PROBE_ARGS:-}
