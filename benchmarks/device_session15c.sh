#!/usr/bin/env bash
# The twelfth session's third call: the overlap order. "before" (the default) forks each
# overlapped weight gradient before its layer's input gradient; "after" forks it once the
# input gradient is issued and runs the lowest layer's on the main stream. Their GPU tests,
# then the compiled steps' kernels and the peers' step times, alternating, fused head on.
# Results: $OUT/results-s15c.tgz.
set -uo pipefail
TAG=s15c
source "$(dirname "$0")/_device_lib.sh"
TAILN=12 run pytest_overlap 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_overlap.py \
  tests/test_gpu_head.py
CONFIGS=784-30-10:sgd:fp32,784-30-10:adam:fp32,784-1024-1024-10:sgd:fp32,784-1024-1024-10:adam:fp32
for o in before after before after; do
  FUSEFLOW_OVERLAP_ORDER=$o TAILN=5 run "profile_$o" 60 python3 benchmarks/profile_step.py --framework fuseflow \
    --out "$res" --tag "s15c_$o" --configs "$CONFIGS"
  mv "$res/profile_fuseflow_s15c_$o.json" "$res/profile_fuseflow_s15c_${o}_$SECONDS.json"
done
SMALL=(--models 784-30-10,784-1024-1024-10 --precisions fp32,tf32 --no-mnist --worker fuseflow)
for o in before after before after; do
  FUSEFLOW_OVERLAP_ORDER=$o TAILN=3 peers "peers_$o" 60 "${SMALL[@]}" --tag "s15c_$o"
  mv "$res/peers_fuseflow_s15c_$o.json" "$res/peers_fuseflow_s15c_${o}_$SECONDS.json"
done
