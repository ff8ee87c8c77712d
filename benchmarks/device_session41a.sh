#!/usr/bin/env bash
# Thirty-eighth session: every GPU test file but the kernel-source compile test, in call
# 158's two groups, on fc31401's own-epilog routing refactor (checked only on the CPU last
# session) and the fused head with GELU below (test_gpu_head.py); then, side by side in
# alternating rounds, the GELU steps with that head on and off (fused_head), and with TF32
# the GELU forward through cuBLASLt's epilog (own_epilog "auto") against the own pass
# ("all"), as device_session40d.sh's first step. Results: $OUT/results-s41a.tgz.
set -uo pipefail
TAG=${TAG:-s41a}
source "$(dirname "$0")/_device_lib.sh"
gpu_groups 220 120
TAILN=10 run ab_gelu_head 80 python3 benchmarks/settings_ab.py --out "$res" \
  --name gelu_head --activation gelu --setting fused_head=False --setting fused_head=True \
  --config 784-30-10:sgd:fp32 --config 784-30-10:adam:fp32 \
  --config 784-1024-1024-10:sgd:fp32 --config 784-1024-1024-10:adam:fp32 \
  --config 784-1024-1024-10:sgd:tf32 --config 784-1024-1024-10:adam:tf32 --rounds 3
TAILN=8 run ab_gelu_forward_tf32 120 python3 benchmarks/settings_ab.py --out "$res" \
  --name gelu_forward_tf32 --activation gelu --setting own_epilog=auto --setting own_epilog=all \
  --config 784-1024-1024-10:sgd:tf32 --config 784-1024-1024-10:adam:tf32 \
  --config 784-4096-4096-10:sgd:tf32 --config 784-4096-4096-10:adam:tf32 --rounds 2
