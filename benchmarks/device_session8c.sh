#!/usr/bin/env bash
# Fifth session, last call: the GPU tests of what changed after call 25 (the batch cast
# of the compute-copy path, 512-row chunks of the tensor-core gradients); fuseflow on every
# model and JAX on the medium and large ones, with time to 98%, one process each; the profiled steps; fuseflow train
# on the GPU in float32 and float16 (CLI=1). Results: $OUT/results-s8c.tgz.
set -uo pipefail
TAG=s8c
source "$(dirname "$0")/_device_lib.sh"
gpu_tests pytest_gpu_changed 120 \
  "skinny_tc or benchmark_shape or compute_copy or compiled_float16 or scaled_gpu or mixed"
TAILN=20 run peers_fuseflow 160 python3 benchmarks/peers.py --worker fuseflow --out "$res" --data-dir .devdata/mnist --tag s8c
# JAX on the models whose targets are open (device time was short): medium and large,
# full fp32 and 16-bit, and time to 98%
TAILN=20 run peers_jax 200 python3 benchmarks/peers.py --worker jax --out "$res" --data-dir .devdata/mnist --tag s8c \
  --models 784-1024-1024-10,784-4096-4096-10 --precisions fp32,16bit
TAILN=3 run profile_fuseflow 60 python3 benchmarks/profile_step.py --framework fuseflow --out "$res" \
  --configs 784-4096-4096-10:adam:16bit --tag s8c
[ "${CLI:-0}" = 1 ] && cli_runs 60
