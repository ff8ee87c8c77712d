#!/usr/bin/env bash
# The ninth session's first call: cuBLASLt's whole configuration space for the medium
# model's full-fp32 matmuls (benchmarks/algo_space_sweep.py), then the short check of the
# eighth session's last commit (training-loop GPU tests, CLI runs, resume in place, eval).
# Results: $OUT/results-s12a.tgz.
set -uo pipefail
TAG=s12a
source "$(dirname "$0")/_device_lib.sh"
TAILN=30 run algo_space_sweep 300 python3 benchmarks/algo_space_sweep.py --out "$res" --tag _s12a
TAILN=4 run pytest_gpu_train 120 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_train.py tests/test_distributed.py tests/test_cli.py tests/test_mlp_training.py
cli_runs 60
TAILN=8 run resume_cuda_fp32 60 python3 -m fuseflow train --backend cuda --resume /tmp/r32/ckpt-epoch3.safetensors --overwrite --no-progress
TAILN=3 run eval_cuda_fp32 60 python3 -m fuseflow eval /tmp/r32/last.safetensors --backend cuda
cp /tmp/r32/metrics.jsonl "$res/resume_cuda_fp32_metrics.jsonl"; tar czf "$OUT/results-$TAG.tgz" -C "$res" .
