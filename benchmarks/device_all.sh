#!/usr/bin/env bash
# Every GPU check and benchmark in one call on a GPU machine, results in one archive:
#   GPU tests (pytest -m gpu), the seed epilog benchmark, `fuseflow train` on MNIST on the
#   GPU in float32 and float16, and the peers benchmark.
#
#   benchmarks/device_all.sh [checks|peers|all] [MNIST_DIR]
#   (default: all, .devdata/mnist; writes $OUT/results-PART.tgz). Each part fits one
#   10-minute call of the device tool.
#
# Run from the repo root after `pip install --target /tmp/site .whl/*.whl` (see docs/gpu.md).
set -uo pipefail
cd "$(dirname "$0")/.."
part="${1:-all}"
mnist="${2:-.devdata/mnist}"
res=/tmp/ffres
rm -rf "$res"; mkdir -p "$res"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MPLBACKEND=Agg
export PYTHONPATH=".:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export FUSEFLOW_DATA="$(dirname "$mnist")"

run() {  # run NAME TIMEOUT CMD...: log to $res/NAME.log, print the tail
  local name=$1 limit=$2; shift 2
  echo "== $name: $*"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$res/$name.log" 2>&1
  local rc=$?
  echo "rc=$rc seconds=$((SECONDS - t0))" | tee -a "$res/$name.log"
  tail -n "${TAILN:-4}" "$res/$name.log"
}

{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import cupy, nvmath, numpy, sys; print(sys.version); print('cupy', cupy.__version__, 'nvmath', nvmath.__version__, 'numpy', numpy.__version__, 'cublasLt', nvmath.bindings.cublasLt.get_version())"
} > "$res/env.txt" 2>&1
cat "$res/env.txt"
if [ "$part" != peers ]; then
TAILN=15 run pytest_gpu 300 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider --junitxml="$res/junit-gpu.xml"
run seed 200 python3 benchmarks/seed_epilogs.py --out "$res/seed_epilogs.json"
run train_cuda_fp32 150 python3 -m fuseflow train --backend cuda --data-dir "$mnist" --out /tmp/run32 --no-progress
run train_cuda_fp16 150 python3 -m fuseflow train --backend cuda --precision float16 --data-dir "$mnist" --out /tmp/run16 --no-progress
cp /tmp/run32/metrics.jsonl "$res/train_cuda_fp32_metrics.jsonl" 2>/dev/null
cp /tmp/run16/metrics.jsonl "$res/train_cuda_fp16_metrics.jsonl" 2>/dev/null
fi
[ "$part" != checks ] && TAILN=40 run peers 330 python3 benchmarks/peers.py --out "$res" --data-dir "$mnist" --quick
tar czf "${OUT:-.}/results-$part.tgz" -C "$res" .
echo "== archived $(ls "$res" | wc -l) files"
