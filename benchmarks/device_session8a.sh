#!/usr/bin/env bash
# Fifth session, first calls: the tensor-core skinny kernels of the float16 output layer
# (_cuda_skinny_tc), the ReLU-gradient pass with 4 rows' loads in flight, and the float16
# compute copy written by the update kernel: their GPU tests (TESTS: a -k expression over
# the backend tests); the kernels alone (skinny_sweep.py --only tc); the large model's
# 16-bit steps with FUSEFLOW_SKINNY_TC and PEERS_COMPUTE_COPY off/on alternating (two
# rounds); the profiled 16-bit Adam step; then (PEERS=1, the default) fuseflow and JAX
# on every model with time to 98%, as in call 22. Results: $OUT/results-s8a.tgz.
set -uo pipefail
TAG=s8a
source "$(dirname "$0")/_device_lib.sh"
gpu_tests pytest_gpu_tc 200 "${TESTS:-skinny}"
TAILN=16 run skinny_sweep_tc 90 python3 benchmarks/skinny_sweep.py --only tc --out "$res"
for r in 1 2; do
  for v in "0 0" "1 0" "1 1"; do
    set -- $v
    FUSEFLOW_SKINNY_TC=$1 PEERS_COMPUTE_COPY=$2 TAILN=8 run peers_tc$1_copy$2_r$r 60 \
      python3 benchmarks/peers.py --worker fuseflow --out "$res" --no-mnist \
      --models 784-4096-4096-10 --precisions 16bit --tag tc$1_copy$2_r$r
  done
done
TAILN=3 run profile_fuseflow 60 python3 benchmarks/profile_step.py --framework fuseflow --out "$res" \
  --configs 784-4096-4096-10:adam:16bit --tag s8a
# fuseflow and JAX, every model and precision, time to 98%, one process each (as call 22)
[ "${PEERS:-1}" = 1 ] && {
  TAILN=20 run peers_fuseflow 160 python3 benchmarks/peers.py --worker fuseflow --out "$res" --data-dir .devdata/mnist --tag s8a
  TAILN=20 run peers_jax 260 python3 benchmarks/peers.py --worker jax --out "$res" --data-dir .devdata/mnist --tag s8a
}
