#!/usr/bin/env bash
# The ninth session's last call: every GPU test on the session's final code (the usability
# fixes in layers, Serial, data, checkpoints, the training loop and the CLI; the docs'
# GPU block in tests/test_docs.py), then fuseflow train on the GPU in float32 and float16,
# a resume in place and an eval. Results: $OUT/results-s12c.tgz.
set -uo pipefail
TAG=s12c
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 420 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests
cli_runs 60
TAILN=8 run resume_cuda_fp32 60 python3 -m fuseflow train --backend cuda --resume /tmp/r32/ckpt-epoch3.safetensors --overwrite --no-progress
TAILN=3 run eval_cuda_fp32 60 python3 -m fuseflow eval /tmp/r32/last.safetensors --backend cuda
cp /tmp/r32/metrics.jsonl "$res/resume_cuda_fp32_metrics.jsonl"; tar czf "$OUT/results-$TAG.tgz" -C "$res" .
