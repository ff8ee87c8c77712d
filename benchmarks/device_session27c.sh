#!/usr/bin/env bash
# Twenty-fourth session's call 117, not run (new device loans were paused after call 116):
# the one-pass output-layer gradients at 4 unrolled k16 steps (GRADS_UNROLL, from call
# 116's sweep). Their GPU tests (call 116's new backend test fixed: a CuPy reference),
# fuseflow (the pass off, the default, and on) and JAX on the 16-bit large model in one
# call (peers.py: the step's share of JAX's bf16 8192^3 matmul), the kernels over launch
# shapes (skinny_sweep.py --only tc), then the compiled 16-bit steps with the pass on and
# off (settings_ab.py, 6 alternating rounds). Results: $OUT/results-s27c.tgz.
set -uo pipefail
TAG=s27c
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run pytest_grads 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_gpu_backend.py -k "linear_grads or one_pass or exact_on_integers"
TAILN=4 peers peers_fuseflow 100 --worker fuseflow --tag s27c --models 784-4096-4096-10 \
  --precisions 16bit --no-mnist
FUSEFLOW_FUSED_SKINNY_GRADS=1 TAILN=4 peers peers_fuseflow_fused 100 --worker fuseflow \
  --tag s27c_fused --models 784-4096-4096-10 --precisions 16bit --no-mnist
TAILN=4 peers peers_jax 130 --worker jax --tag s27c --models 784-4096-4096-10 \
  --precisions 16bit --no-mnist
TAILN=12 run skinny_sweep_tc 50 python3 benchmarks/skinny_sweep.py --out "$res" --only tc
TAILN=6 run ab_fused_grads 150 python3 benchmarks/settings_ab.py --out "$res" --name fused_grads \
  --setting fused_skinny_grads=True --setting fused_skinny_grads=False --rounds 6
