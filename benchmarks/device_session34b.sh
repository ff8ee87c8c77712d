#!/usr/bin/env bash
# Thirty-first session, call 130: 3xTF32 in the own float32 matmul (_cuda_gemm's
# mma="tf32x3", and "tf32x3p" with the tensor cores' sums added per k-tile with
# round-to-nearest). Its accuracy against float64 beside cuBLASLt's float32 and TF32
# (tf32x3_probe.py), the compiled medium full-float32 steps with it on and off side by side
# (settings_ab.py), JAX's steps in the same call, the own matmul's GPU tests, then the
# per-matmul launch sweep. Results: $OUT/results-s34b.tgz.
set -uo pipefail
TAG=s34b
source "$(dirname "$0")/_device_lib.sh"
TAILN=10 run tf32x3_probe 90 python3 benchmarks/tf32x3_probe.py --out "$res"
ON="own_gemm_max_macs=2147483648"
TAILN=8 run ab_tf32x3 150 python3 benchmarks/settings_ab.py --out "$res" --name tf32x3 \
  --config 784-1024-1024-10:sgd:fp32 --config 784-1024-1024-10:adam:fp32 \
  --config 784-30-10:sgd:fp32 --config 784-30-10:adam:fp32 \
  --setting own_gemm_max_macs=0 --setting "$ON,own_gemm_mma=tf32x3" \
  --setting "$ON,own_gemm_mma=tf32x3p" --setting "$ON,own_gemm_mma=simt" --rounds 3
TAILN=3 peers peers_jax 90 --worker jax --tag "${TAG}_fp32" \
  --models 784-30-10,784-1024-1024-10 --precisions fp32,tf32x3 --no-mnist
TAILN=15 run pytest_own_gemm 170 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  $(xdist load) tests/test_own_gemm.py
TAILN=8 run gemm_sweep 120 python3 benchmarks/gemm_sweep.py --out "$res" --name gemm_sweep_tf32x3 \
  --mma tf32x3,tf32x3p --warps 2x2,1x2 --splits 1,2,4,8 --bk 8,16 --layers 5
tar czf "$OUT/results-$TAG.tgz" -C "$res" .
