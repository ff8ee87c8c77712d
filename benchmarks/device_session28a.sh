#!/usr/bin/env bash
# Twenty-fifth session's first call, prepared without a device (none was lent). The GPU
# tests of its changes: the batch cast in the graph's copy (ff.compile's cast_args, on by
# default for mixed-precision steps), the loss scaling's two launches fewer (counts kept by
# the update kernel, 1 / scale formed by the finiteness kernel) and the output layer's
# forward with its loss (linear_xent), with the copy kernel's and the fused optimizers'
# older tests; then the compiled 16-bit steps with all of it (the defaults), with the cast
# at the graph's start, and with the forward and the loss apart (settings_ab.py, 5
# alternating rounds, two batches a step); the 16-bit Adam step's timeline.
# Results: $OUT/results-s28a.tgz.
set -uo pipefail
TAG=s28a
source "$(dirname "$0")/_device_lib.sh"
TAILN=10 run pytest_new 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_compile_cast.py tests/test_gpu_tc_xent.py tests/test_fused_optim.py \
  tests/test_compile.py -k "cast or batch or copies or copy or xent or skip or inverse or scal"
ab cast_in_copy 300 5 _cuda_graph_inputs.CAST_IN_COPY=True \
  _cuda_graph_inputs.CAST_IN_COPY=False fused_tc_xent=False
TAILN=3 run profile_16bit 90 python3 benchmarks/profile_step.py --framework fuseflow \
  --out "$res" --tag s28a --configs 784-4096-4096-10:adam:16bit
