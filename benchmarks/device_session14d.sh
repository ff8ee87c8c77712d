#!/usr/bin/env bash
# The eleventh session's fourth call: the FP64 route of small full-float32 matmuls
# (CudaBackend.fp64_gemm_max_macs): its GPU tests with those of the backend, layers,
# compile, fused optimizers and overlap; the route against the float32 path per op; and
# the compiled steps' kernels with the route on (default), off, and with the weight
# gradients too. Results: $OUT/results-s14d.tgz.
set -uo pipefail
TAG=s14d
source "$(dirname "$0")/_device_lib.sh"
TAILN=15 run pytest_gpu_route 330 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_fp64_gemm.py tests/test_gpu_backend.py tests/test_gpu_layers.py tests/test_compile.py \
  tests/test_fused_optim.py tests/test_overlap.py
TAILN=20 run fp64_probe_route 90 python3 benchmarks/fp64_probe.py --out "$res" --route --name fp64_probe_route
CONF=784-30-10:sgd:fp32,784-30-10:adam:fp32,784-1024-1024-10:sgd:fp32,784-1024-1024-10:adam:fp32
TAILN=6 run profile_route_on 60 python3 benchmarks/profile_step.py --framework fuseflow --out "$res" --tag route_on --configs $CONF
FUSEFLOW_FP64_GEMM_MAX_MACS=0 TAILN=6 run profile_route_off 60 python3 benchmarks/profile_step.py --framework fuseflow --out "$res" --tag route_off --configs $CONF
FUSEFLOW_FP64_GEMM_OPS=forward,dgrad,wgrad TAILN=6 run profile_route_wgrad 60 python3 benchmarks/profile_step.py --framework fuseflow --out "$res" --tag route_wgrad --configs $CONF
