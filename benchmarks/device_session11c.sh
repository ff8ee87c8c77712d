#!/usr/bin/env bash
# A short last check of the eighth session's final training-loop code on the GPU: the GPU
# tests of the training loop, fuseflow train in float32 and float16, a resume in place
# from epoch 3 with --overwrite, and an eval. Results: $OUT/results-s11c.tgz.
set -uo pipefail
TAG=s11c
source "$(dirname "$0")/_device_lib.sh"
TAILN=4 run pytest_gpu_train 120 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_train.py tests/test_distributed.py tests/test_cli.py tests/test_mlp_training.py
cli_runs 60
TAILN=8 run resume_cuda_fp32 60 python3 -m fuseflow train --backend cuda --resume /tmp/r32/ckpt-epoch3.safetensors --overwrite --no-progress
TAILN=3 run eval_cuda_fp32 60 python3 -m fuseflow eval /tmp/r32/last.safetensors --backend cuda
cp /tmp/r32/metrics.jsonl "$res/resume_cuda_fp32_metrics.jsonl"; tar czf "$OUT/results-$TAG.tgz" -C "$res" .
