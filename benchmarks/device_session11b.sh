#!/usr/bin/env bash
# The eighth session's last call: every GPU test on its final code (fit's output-folder
# rules, SIGTERM), fuseflow train on the GPU in float32 and float16, then a resume in place
# from epoch 3 with --overwrite (fit compares the device state with the checkpoint) and an
# eval of the result. Results: $OUT/results-s11b.tgz.
set -uo pipefail
TAG=s11b
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 340 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider
cli_runs 60
TAILN=8 run resume_cuda_fp32 60 python3 -m fuseflow train --backend cuda --resume /tmp/r32/ckpt-epoch3.safetensors --overwrite --no-progress
TAILN=3 run eval_cuda_fp32 60 python3 -m fuseflow eval /tmp/r32/last.safetensors --backend cuda
cp /tmp/r32/metrics.jsonl "$res/resume_cuda_fp32_metrics.jsonl"; tar czf "$OUT/results-$TAG.tgz" -C "$res" .
