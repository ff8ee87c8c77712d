#!/usr/bin/env bash
# A profiling call on the GPU machine: GPU tests, then where the step time goes (every
# kernel of fuseflow's compiled step and of JAX's jitted step) and every cuBLASLt algorithm
# for the small models' matmuls. Results: $OUT/profile.tgz
set -uo pipefail
cd "$(dirname "$0")/.."
res=/tmp/ffprof; rm -rf "$res"; mkdir -p "$res"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MPLBACKEND=Agg
export PYTHONPATH=".:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" FUSEFLOW_DATA="$PWD/.devdata"
run() { local name=$1 limit=$2; shift 2; echo "== $name"; local t0=$SECONDS
  timeout "$limit" "$@" > "$res/$name.log" 2>&1; echo "rc=$? seconds=$((SECONDS - t0))" | tee -a "$res/$name.log"
  tail -n "${TAILN:-6}" "$res/$name.log"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$res/env.txt" 2>&1
TAILN=14 run profile_fuseflow 150 python3 benchmarks/profile_step.py --framework fuseflow --out "$res"
TAILN=14 run profile_jax 200 python3 benchmarks/profile_step.py --framework jax --out "$res"
TAILN=30 run matmul_sweep 200 python3 benchmarks/matmul_sweep.py --out "$res"
TAILN=12 run pytest_gpu 240 python3 -m pytest -m gpu -q -x -rfE -p no:cacheprovider
tar czf "$OUT/profile.tgz" -C "$res" .
