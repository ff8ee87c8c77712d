#!/usr/bin/env bash
# Eighteenth session, call 89: every GPU test on the session's final code (the kernel-source
# test runs on the CPU machine with NVRTC), the CLI on the GPU in float32 and float16, and
# the hand-written nvmath pattern's steps (its row of the whole matrix; call 90 runs
# fuseflow, torch and JAX). Results: $OUT/results-s21e.tgz.
set -uo pipefail
TAG=s21e
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 420 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests \
  --ignore=tests/test_kernel_sources.py
cli_runs 60
TAILN=4 peers peers_hand_nvmath 100 --no-mnist --worker hand_nvmath --tag s21e
