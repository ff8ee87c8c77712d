#!/usr/bin/env bash
# Ran as call 166 on commit 34bf728 (early_update_after, reverted after this call and call 167).
# Thirty-sixth session, first call: the side stream's early update waiting for the input
# gradient's matmul only (early_update_after "product", new default) against waiting for
# the ReLU-gradient pass too ("epilog", before): the medium fp32 compiled steps side by
# side (settings_ab.py, 4 rounds), fuseflow's paired time to 98% (twenty shared seeds)
# under each, alternating, two rounds, then JAX's once; the medium steps' timelines under
# the new default; the touched files' GPU tests. Results: $OUT/results-s39a.tgz.
set -uo pipefail
TAG=${TAG:-s39a}
source "$(dirname "$0")/_device_lib.sh"
n6="-n 6 --dist load"; python3 -c "import xdist" 2>/dev/null || n6=""
TAILN=20 run pytest_split 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider $n6 \
  tests/test_split_update.py
TAILN=12 run ab_early_after 200 python3 benchmarks/settings_ab.py --out "$res" \
  --name early_after --setting early_update_after=epilog --setting early_update_after=product \
  --config 784-1024-1024-10:sgd:fp32 --config 784-1024-1024-10:adam:fp32 --rounds 4
for r in 1 2; do for v in epilog product; do
  FUSEFLOW_EARLY_UPDATE_AFTER=$v TAILN=4 peers "peers_fuseflow_${v}_$r" 90 --worker fuseflow \
    --tag "${TAG}_${v}_$r" --models 784-30-10 --precisions fp32 --mnist-start shared \
    --mnist-seeds 20
done; done
TAILN=4 peers peers_jax_shared 150 --worker jax --tag "${TAG}_jax" --models 784-30-10 \
  --precisions fp32 --mnist-start shared --mnist-seeds 20
TAILN=3 run profile_fuseflow 90 python3 benchmarks/profile_step.py --framework fuseflow \
  --out "$res" --tag "$TAG" --configs 784-1024-1024-10:sgd:fp32,784-1024-1024-10:adam:fp32
