#!/usr/bin/env bash
# Thirty-first session, call 129. First 3xTF32 in the own float32 matmul (_cuda_gemm's
# mma="tf32x3", and "tf32x3p", whose tensor-core sums are added per k-tile with
# round-to-nearest): its accuracy against float64 beside cuBLASLt's float32 and TF32
# (tf32x3_probe.py), the compiled full-float32 steps with it on and off side by side
# (settings_ab.py), JAX's steps in the same call (full float32 and its 3xTF32). Then every GPU test on the tree: the
# thirtieth session's final code with the bfloat16 tensor-core output-layer kernels
# re-applied (commit 65d2a8f, which no GPU had run) and the tf32x3 tests. Results:
# $OUT/results-s34a.tgz.
set -uo pipefail
TAG=s34a
source "$(dirname "$0")/_device_lib.sh"
TAILN=10 run tf32x3_probe 90 python3 benchmarks/tf32x3_probe.py --out "$res"
ON="own_gemm_max_macs=2147483648"
TAILN=8 run ab_tf32x3 150 python3 benchmarks/settings_ab.py --out "$res" --name tf32x3 \
  --config 784-1024-1024-10:sgd:fp32 --config 784-1024-1024-10:adam:fp32 \
  --config 784-30-10:sgd:fp32 \
  --setting own_gemm_max_macs=0 --setting "$ON,own_gemm_mma=tf32x3" \
  --setting "$ON,own_gemm_mma=tf32x3p" --rounds 3
TAILN=3 peers peers_jax 90 --worker jax --tag "${TAG}_fp32" \
  --models 784-30-10,784-1024-1024-10 --precisions fp32,tf32x3 --no-mnist
all_gpu_tests $((580 - SECONDS))
tar czf "$OUT/results-$TAG.tgz" -C "$res" .
