#!/usr/bin/env bash
# The sixteenth session's fourth call: the medium model's fused optimizer update, elements
# per thread and grid caps, alone and inside the compiled Adam step (update_probe.py).
# Results: $OUT/results-s19d.tgz.
set -uo pipefail
TAG=s19d
source "$(dirname "$0")/_device_lib.sh"
TAILN=40 run update_probe 240 python3 benchmarks/update_probe.py --out "$res"
