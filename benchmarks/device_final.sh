#!/usr/bin/env bash
# The session's final GPU call: GPU tests of the engine, compile and fused kernels, the CLI
# on MNIST on the GPU (float32 and float16), and fuseflow's peers numbers (default plans,
# then nvmath autotuned plans for the two small models). Results: $OUT/results-final.tgz
set -uo pipefail
cd "$(dirname "$0")/.."
res=/tmp/ffres; rm -rf "$res"; mkdir -p "$res"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MPLBACKEND=Agg
export PYTHONPATH=".:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" FUSEFLOW_DATA="$PWD/.devdata"
run() { local name=$1 limit=$2; shift 2; echo "== $name"; local t0=$SECONDS
  timeout "$limit" "$@" > "$res/$name.log" 2>&1; echo "rc=$? seconds=$((SECONDS - t0))" | tee -a "$res/$name.log"
  tail -n "${TAILN:-6}" "$res/$name.log"; }
TAILN=12 run pytest_gpu 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_compile.py tests/test_fused_optim.py tests/test_gpu_layers.py tests/test_train.py \
  tests/test_cli.py tests/test_optim.py tests/test_data.py tests/test_checkpoint.py
run train_cuda_fp32 90 python3 -m fuseflow train --backend cuda --data-dir .devdata/mnist --out /tmp/r32 --no-progress
run train_cuda_fp16 90 python3 -m fuseflow train --backend cuda --precision float16 --data-dir .devdata/mnist --out /tmp/r16 --no-progress
run eval_cuda_fp32 60 python3 -m fuseflow eval /tmp/r32/last.safetensors --backend cuda --data-dir .devdata/mnist
cp /tmp/r32/metrics.jsonl "$res/train_cuda_fp32_metrics.jsonl"; cp /tmp/r16/metrics.jsonl "$res/train_cuda_fp16_metrics.jsonl"
TAILN=18 run peers_fuseflow 150 python3 benchmarks/peers.py --worker fuseflow --out "$res" --quick --data-dir .devdata/mnist
FUSEFLOW_AUTOTUNE=1 TAILN=6 run peers_autotune 90 python3 benchmarks/peers.py --worker fuseflow --out "$res" --quick --no-mnist --tag autotune --models 784-30-10,784-1024-1024-10
tar czf "$OUT/results-final.tgz" -C "$res" .
