#!/usr/bin/env bash
# Nineteenth session, call 99: the split optimizer update (the side stream's leaves updated
# there, beside the last weight gradient): its tests, the rest of the GPU suite that call 98
# did not reach (the own matmul's last tests, random bits, train), the compile/overlap/fused
# optimizer tests; a timeline of the medium Adam step with it; on/off side by side.
# Results: $OUT/results-s22b.tgz.
set -uo pipefail
TAG=s22b
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_split 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_split_update.py tests/test_overlap.py tests/test_compile.py tests/test_fused_optim.py
TAILN=3 run profile 60 python3 benchmarks/profile_step.py --framework fuseflow --out "$res" --tag "$TAG" \
  --configs "784-1024-1024-10:adam:fp32,784-1024-1024-10:sgd:fp32"
TAILN=12 run split_probe 150 python3 benchmarks/split_update_probe.py --out "$res" --rounds 4
TAILN=8 run pytest_tail 120 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_random_bits.py tests/test_train.py tests/test_train_cli_audit.py tests/test_own_gemm.py \
  -k "not test_dgrad and not test_forward and not test_gemm"
