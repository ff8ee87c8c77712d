#!/usr/bin/env bash
# Fourth session, third call: every GPU test on the session's code, the command line's
# training runs (float32 and float16).
# Results: $OUT/results-s7c.tgz.
set -uo pipefail
TAG=s7c
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu 340 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider
TAILN=8 run train_cuda_fp32 60 python3 -m fuseflow train --backend cuda --data-dir .devdata/mnist --out /tmp/r32 --no-progress
TAILN=8 run train_cuda_fp16 60 python3 -m fuseflow train --backend cuda --precision float16 --data-dir .devdata/mnist --out /tmp/r16 --no-progress
cp /tmp/r32/metrics.jsonl "$res/train_cuda_fp32_metrics.jsonl"; cp /tmp/r16/metrics.jsonl "$res/train_cuda_fp16_metrics.jsonl"
tar czf "$OUT/results-$TAG.tgz" -C "$res" .
# (the profile of the changed steps is in call 2's results; device time is short)
