#!/usr/bin/env bash
# Forty-first session: the wgmma probe with its convert pass reading a tile's quads before
# any store (--quick sweep); then why its k-tile takes about 1.3 us: Nsight Compute on
# layer 2's forward by cuBLASLt's TF32 and two probe launches (wgmma_probe.NCU_VARIANTS),
# the full section set into a report, then its per-instruction SASS page (with stall
# samples) as CSV and the details page as text.
# Results: $OUT/results-s44c.tgz.
set -uo pipefail
TAG=${TAG:-s44c}
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run wgmma_probe_quick 150 python3 benchmarks/wgmma_probe.py --out "$res" --quick \
  --name wgmma_probe_quick
TAILN=5 run ncu_wgmma 300 ncu --clock-control none --profile-from-start off --set full \
  --import-source no -o "$res/wgmma" python3 benchmarks/wgmma_probe.py --ncu
TAILN=3 run ncu_details 60 ncu -i "$res/wgmma.ncu-rep" --page details
TAILN=3 run ncu_sass 60 ncu -i "$res/wgmma.ncu-rep" --page source --print-source sass --csv
