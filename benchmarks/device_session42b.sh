#!/usr/bin/env bash
# Thirty-ninth session, second call. Call 181 found the 16-bit large GELU steps 1.09-1.10x
# JAX's (its ReLU steps run 0.85-0.86x). Here: the fixed TF32 mask test; where the 16-bit
# GELU step's time goes (profiles of fuseflow, default and with its own 16-bit GELU epilogs,
# FUSEFLOW_OWN_GELU_16BIT=1, and of JAX); the same settings side by side; and the GELU
# tests with the 16-bit own epilogs on. Results: $OUT/results-s42b.tgz.
set -uo pipefail
TAG=${TAG:-s42b}
source "$(dirname "$0")/_device_lib.sh"
TAILN=4 run pytest_masks 120 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_gpu_backend.py -k "tf32_bias_relu_epilogs or gelu_epilogs_take_the_own_pass"
C=784-4096-4096-10:sgd:16bit,784-4096-4096-10:adam:16bit
TAILN=3 run profile_default 90 python3 benchmarks/profile_step.py --framework fuseflow \
  --activation gelu --configs $C --out "$res" --tag "${TAG}_default"
FUSEFLOW_OWN_GELU_16BIT=1 TAILN=3 run profile_own16 90 python3 benchmarks/profile_step.py \
  --framework fuseflow --activation gelu --configs $C --out "$res" --tag "${TAG}_own16"
FUSEFLOW_OWN_GELU_16BIT=1 FUSEFLOW_OWN_EPILOG=all TAILN=3 run profile_own16_all 90 \
  python3 benchmarks/profile_step.py --framework fuseflow --activation gelu --configs $C \
  --out "$res" --tag "${TAG}_own16_all"
TAILN=3 run profile_jax 90 python3 benchmarks/profile_step.py --framework jax \
  --activation gelu --configs $C --out "$res" --tag "${TAG}"
TAILN=8 run ab_gelu16 200 python3 benchmarks/settings_ab.py --out "$res" --name gelu16_s42b \
  --activation gelu --rounds 2 --setting own_epilog=auto \
  --setting _cuda_epilogs.HALF_GELU=True --setting _cuda_epilogs.HALF_GELU=True,own_epilog=all
FUSEFLOW_OWN_GELU_16BIT=1 TAILN=8 run pytest_gelu16 150 python3 -m pytest -m gpu -q -rfE \
  -p no:cacheprovider $(xdist load) tests/test_gpu_backend.py tests/test_gpu_head.py \
  tests/test_compile.py -k "gelu or GELU"
