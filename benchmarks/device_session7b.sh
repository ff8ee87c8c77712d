#!/usr/bin/env bash
# Fourth session, second call: the GPU tests of the 16-byte multi-tensor accesses and of
# the loss kernel's scaled 16-bit gradient; the kernels alone (kernels.py: 4 elements per
# thread against 16 bytes per access); the large model's steps with FUSEFLOW_VECTOR_BYTES=8
# and 16 alternating (two rounds), and the profiled steps. Results: $OUT/results-s7b.tgz.
set -uo pipefail
TAG=s7b
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_gpu_changed 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_fused_optim.py tests/test_mixed_precision.py tests/test_compile.py \
  tests/test_gpu_backend.py -k "xent or mixed_precision or scaled or finite or cast or compile or float16 or fit"
TAILN=20 run kernels 120 python3 benchmarks/kernels.py --out "$res" --repeat 30
for r in 1 2; do
  for vb in 8 16; do
    FUSEFLOW_VECTOR_BYTES=$vb TAILN=8 run peers_vb${vb}_r$r 60 python3 benchmarks/peers.py --worker fuseflow \
      --out "$res" --no-mnist --models 784-4096-4096-10 --precisions 16bit --tag vb${vb}_r$r
  done
done
TAILN=3 run profile_fuseflow 60 python3 benchmarks/profile_step.py --framework fuseflow --out "$res" \
  --configs 784-1024-1024-10:sgd:fp32,784-4096-4096-10:adam:16bit --tag s7b
