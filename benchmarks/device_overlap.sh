#!/usr/bin/env bash
# A GPU call for weight gradients overlapped on a second stream: its tests and the compiled
# step's, the safeguard check (benchmarks/overlap_check.py), fuseflow's small and medium step
# times with FUSEFLOW_OVERLAP_WGRAD=0 and 1 alternating (two rounds), JAX's in the same call,
# and the kernel profile both ways. Results: $OUT/results-overlap.tgz.
set -uo pipefail
TAG=overlap
source "$(dirname "$0")/_device_lib.sh"
SMALL=784-30-10,784-1024-1024-10
PROF=784-30-10:sgd:fp32,784-1024-1024-10:sgd:fp32,784-1024-1024-10:adam:fp32
TAILN=8 run pytest_overlap 150 python3 -m pytest -m gpu -q -x -rfE -p no:cacheprovider tests/test_overlap.py tests/test_compile.py
TAILN=5 run overlap_check 60 python3 benchmarks/overlap_check.py --out "$res"
for round in 1 2; do
  for ov in 0 1; do
    FUSEFLOW_OVERLAP_WGRAD=$ov TAILN=8 run peers_fuseflow_ov${ov}_r$round 60 python3 benchmarks/peers.py --worker fuseflow --out "$res" --no-mnist --models $SMALL --tag ov${ov}_r$round
  done
done
TAILN=10 run peers_jax 100 python3 benchmarks/peers.py --worker jax --out "$res" --no-mnist --models $SMALL
for ov in 0 1; do
  FUSEFLOW_OVERLAP_WGRAD=$ov TAILN=4 run profile_ov$ov 40 python3 benchmarks/profile_step.py --framework fuseflow --out "$res" --configs $PROF --tag ov$ov
done
