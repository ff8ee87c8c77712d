#!/usr/bin/env bash
# Thirty-eighth session: every GPU test file but the kernel-source compile test, in call
# 158's two groups, on fc31401 (the own-epilog routing refactor, checked only on the CPU
# last session), then device_session40d.sh's first step: with TF32, the GELU forward
# through cuBLASLt's epilog (own_epilog "auto") against the own pass ("all"), medium and
# large GELU steps, alternating rounds. Results: $OUT/results-s41a.tgz.
set -uo pipefail
TAG=${TAG:-s41a}
source "$(dirname "$0")/_device_lib.sh"
gpu_groups 230 130
TAILN=8 run ab_gelu_forward_tf32 200 python3 benchmarks/settings_ab.py --out "$res" \
  --name gelu_forward_tf32 --activation gelu --setting own_epilog=auto --setting own_epilog=all \
  --config 784-1024-1024-10:sgd:tf32 --config 784-1024-1024-10:adam:tf32 \
  --config 784-4096-4096-10:sgd:tf32 --config 784-4096-4096-10:adam:tf32 --rounds 3
