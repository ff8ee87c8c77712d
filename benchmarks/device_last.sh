#!/usr/bin/env bash
# A GPU call for changed kernels: the backend's GPU tests, the kernel variants side by side
# (benchmarks/kernels.py), fuseflow's peers numbers, then fuseflow again with its own
# epilogs only in full float32 (FUSEFLOW_OWN_EPILOG=fp32) and with every matmul of the large
# model autotuned, and the kernel profile. Results: $OUT/results-last.tgz, rewritten after
# every step. (The ratios against JAX come from device_final.sh, which runs both.)
set -uo pipefail
TAG=last
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run pytest_gpu 200 python3 -m pytest -m gpu -q -x -rfE -p no:cacheprovider tests/test_gpu_backend.py tests/test_kernel_sources.py tests/test_fused_optim.py tests/test_compile.py
TAILN=40 run kernels 60 python3 benchmarks/kernels.py --out "$res"
TAILN=20 run peers_fuseflow 60 python3 benchmarks/peers.py --worker fuseflow --out "$res" --no-mnist
FUSEFLOW_OWN_EPILOG=fp32 TAILN=8 run peers_fuseflow_own_epilog_fp32 45 python3 benchmarks/peers.py --worker fuseflow --out "$res" --no-mnist --tag own_epilog_fp32 --models 784-4096-4096-10
TAILN=3 run profile_fuseflow 40 python3 benchmarks/profile_step.py --framework fuseflow --out "$res"
FUSEFLOW_AUTOTUNE=1 FUSEFLOW_AUTOTUNE_MAX_MACS=1099511627776 TAILN=8 run peers_fuseflow_autotune 120 python3 benchmarks/peers.py --worker fuseflow --out "$res" --no-mnist --tag autotune_all --models 784-4096-4096-10
