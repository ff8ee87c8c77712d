#!/usr/bin/env bash
# Thirty-third session: the GPU tests of the shared NaN-tolerant bit comparison (moved to
# tests/reference.py after call 135), then fuseflow and JAX on the whole matrix (every
# model, fp32 / TF32 / 16-bit, the time to 98% and memory; the last whole matrix on an
# H200 was call 110), the CLI on the GPU, and the 16-bit large Adam step spread over
# processes. Results: $OUT/results-$TAG.tgz (s36a unless TAG is set). Calls 137-138 ran it
# with float16 as peers.py's 16-bit dtype and the one-pass output gradients off; since
# call 139 the defaults are bfloat16 and the pass on (FUSEFLOW_FUSED_SKINNY_GRADS=0 and
# --fuseflow-16bit fp16 give the earlier form).
set -uo pipefail
TAG=${TAG:-s36a}  # device_session36b.sh runs this script as TAG=s36b
source "$(dirname "$0")/_device_lib.sh"
TAILN=10 run pytest_moved_helper 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_bfloat16.py tests/test_compile_cast.py
TAILN=4 peers peers_fuseflow 150 --worker fuseflow --tag "$TAG"
TAILN=4 peers peers_jax 200 --worker jax --tag "$TAG"
cli_runs 60
spread_16bit 60
