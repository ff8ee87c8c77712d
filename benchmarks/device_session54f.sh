#!/usr/bin/env bash
# Fifty-first session, last call (about 660 s of device time left). The one-pass output
# layer's GPU tests that failed in call 216 on the tests' own faults (a relu_aux of the
# wrong size; SGD at a learning rate that did not learn in 8 steps; a bias one 16-bit
# gradient step apart), then Nsight Compute on the kernel (details and SASS stall sites):
# call 216 took 117-120 us alone, about 6.5 us a 32-row tile, where its memory traffic
# needs about 45. On an H200 the whole matrix runs first, and Nsight Compute not at all.
# Results: $OUT/results-$TAG.tgz.
set -uo pipefail
TAG=${TAG:-s54f}
source "$(dirname "$0")/_device_lib.sh"
if grep -q H200 "$res/env.txt"; then whole_matrix; fi
TAILN=25 run pytest_tc_head 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_gpu_tc_head.py -k "linear_xent_grads or step_with"
if ! grep -q H200 "$res/env.txt"; then
  NCU=(ncu --clock-control none --profile-from-start off --set full --import-source no
       -k regex:tc_head --launch-count 1)
  TAILN=4 run ncu_tc_head 150 "${NCU[@]}" --page details --print-details all \
    python3 benchmarks/tc_head_sweep.py --out "$res" --ncu
  TAILN=4 run ncu_tc_head_source 150 "${NCU[@]}" --page source --print-source sass \
    python3 benchmarks/tc_head_sweep.py --out "$res" --ncu
fi
