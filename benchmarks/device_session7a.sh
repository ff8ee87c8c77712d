#!/usr/bin/env bash
# Fourth session, first call: the GPU tests of the third session's CPU-checked commits
# (side-stream plan key, join, shared_shape model, batches helper, skinny shared memory).
set -uo pipefail
TAG=s7a
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu_recent 240 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_overlap.py tests/test_compile.py tests/test_train.py tests/test_data.py \
  "tests/test_gpu_backend.py::test_skinny_launch_shapes_match_numpy"
