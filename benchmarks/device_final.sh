#!/usr/bin/env bash
# The session's main GPU call: every GPU test, the CLI on MNIST on the GPU (float32 and
# float16), the kernels of fuseflow's compiled steps, and the fuseflow and JAX peers numbers
# (with time to 98%) from one machine in one call, plus fuseflow's large model with
# autotuning off (FUSEFLOW_AUTOTUNE=0) for a side-by-side. PART=peers2 runs the other peers
# (torch, the hand-written nvmath pattern) for a second call right after.
# Results: $OUT/*.tgz, rewritten after every step.
set -uo pipefail
TAG=${PART:-main}
source "$(dirname "$0")/_device_lib.sh"
if [ "$TAG" = main ]; then
  TAILN=12 run pytest_gpu 240 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider
  cli_runs 90
  run eval_cuda_fp32 60 python3 -m fuseflow eval /tmp/r32/last.safetensors --backend cuda --data-dir .devdata/mnist
  TAILN=20 run peers_fuseflow 150 python3 benchmarks/peers.py --worker fuseflow --out "$res" --data-dir .devdata/mnist
  TAILN=20 run peers_jax 240 python3 benchmarks/peers.py --worker jax --out "$res" --data-dir .devdata/mnist
  TAILN=3 run profile_fuseflow 90 python3 benchmarks/profile_step.py --framework fuseflow --out "$res"
  TAILN=3 run skinny_sweep 60 python3 benchmarks/skinny_sweep.py --out "$res"
  FUSEFLOW_AUTOTUNE=0 TAILN=8 run peers_fuseflow_autotune_off 60 python3 benchmarks/peers.py --worker fuseflow --out "$res" --no-mnist --tag autotune_off --models 784-4096-4096-10
else
  TAILN=30 run peers_torch 300 python3 benchmarks/peers.py --worker torch --out "$res"
  TAILN=6 run peers_hand 90 python3 benchmarks/peers.py --worker hand_nvmath --out "$res"
fi
