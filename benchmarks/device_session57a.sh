#!/usr/bin/env bash
# Fifty-fourth session: on an H200 (not reached since calls 149-150), device_session54a.sh's
# measurements (the whole matrix, two interleaved_16bit.py processes, a peers.py 16-bit
# pair). On any other GPU, the GPU tests of the code this session changed instead: the
# weight-decay mask's flags (optimizers, fused updates), ff.compile's keyword binding, the
# command line (checkpoint reads), Serial's Dense subclasses and fit's resumes (layers,
# overlap, fused head, bfloat16, train), then fuseflow train on the GPU. Results:
# $OUT/results-$TAG.tgz.
set -uo pipefail
TAG=${TAG:-s57a}
source "$(dirname "$0")/_device_lib.sh"
cat "$res/env.txt"
if grep -q H200 "$res/env.txt"; then
  whole_matrix  # first: each step's results are packed as it ends, so a cut call keeps them
  interleaved_16bit interleaved_1 150 --tag "${TAG}_1" --rounds 3 --window 1.5
  pair_16bit 45
  interleaved_16bit interleaved_2 150 --tag "${TAG}_2" --rounds 3 --window 1.5
else
  TAILN=12 run pytest_changed 300 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
    $(xdist load 6) tests/test_optim.py tests/test_fused_optim.py tests/test_compile.py \
    tests/test_compile_cast.py tests/test_checkpoint.py tests/test_train.py \
    tests/test_gpu_layers.py tests/test_overlap.py tests/test_fused_head.py tests/test_bfloat16.py
  cli_runs 60
fi
