#!/usr/bin/env bash
# Seventeenth session, call 83: the donated params and optimizer state kept in L2
# (FUSEFLOW_L2_PERSIST=1, one buffer under an access policy window): the compile-path tests
# with it on, the step probe and MNIST epochs with it on and off, and the medium steps'
# timeline with it on. Results: $OUT/results-s20f.tgz.
set -uo pipefail
TAG=s20f
source "$(dirname "$0")/_device_lib.sh"
FUSEFLOW_L2_PERSIST=1 TAILN=8 run pytest_l2 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_compile.py tests/test_optim_compile_audit.py tests/test_overlap.py tests/test_gpu_head.py tests/test_train.py
TAILN=12 run step_overhead_probe 90 python3 benchmarks/step_overhead_probe.py --out "$res" \
  --data-dir .devdata/mnist --variants memcpy,in_graph+tail,in_graph+tail+l2
FUSEFLOW_L2_PERSIST=1 TAILN=3 run profile_l2 60 python3 benchmarks/profile_step.py --framework fuseflow \
  --out "$res" --tag "${TAG}_l2" --configs 784-1024-1024-10:sgd:fp32,784-1024-1024-10:adam:fp32
