#!/usr/bin/env bash
# One command for a GPU machine: every GPU test in the repo (pytest -m gpu, junit xml) and the
# GPU benchmarks, all output under one folder.
#
#   benchmarks/gpu_run.sh [OUTDIR]        (default: $OUT if set, else benchmarks/results/gpu-run)
#
# Run from the repository root. Needs CuPy, nvmath-python and optree importable; if they are
# not and ./.whl holds wheels (../shared/tools/device-wheels.sh fills it), they are installed
# into /tmp/site first. Writes: env.txt, pytest.log, junit-gpu.xml, seed_epilogs.json,
# seed_epilogs.log (extra benchmark flags: SEED_ARGS="--quick"). Exit status: non-zero if the tests or a benchmark failed.
set -uo pipefail
cd "$(dirname "$0")/.."
outdir="${1:-${OUT:-benchmarks/results/gpu-run}}"
mkdir -p "$outdir"
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false   # JAX (DLPack tests) must not take the GPU's memory
export PYTHONPATH=".:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"

if ! python3 -c "import nvmath, optree" 2>/dev/null; then
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
  else
    echo "nvmath-python/optree missing and no ./.whl wheels: run ../shared/tools/device-wheels.sh" >&2
    exit 1
  fi
fi

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  git rev-parse HEAD 2>/dev/null; git status --short 2>/dev/null | head -50
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  python3 - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0])
for m in ("numpy", "cupy", "nvmath", "optree", "torch", "jax"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:
        print(m, "unavailable:", type(e).__name__, e)
try:
    import cupy, nvmath.bindings.cublasLt as lt
    print("cuda runtime", cupy.cuda.runtime.runtimeGetVersion(),
          "driver api", cupy.cuda.runtime.driverGetVersion(), "cublasLt", lt.get_version())
except Exception as e:
    print("cuda info unavailable:", e)
EOF
} > "$outdir/env.txt" 2>&1
cat "$outdir/env.txt"

status=0
echo "== pytest -m gpu"
timeout_flag=()
python3 -c "import pytest_timeout" 2>/dev/null && timeout_flag=(--timeout=300)
python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider -o junit_family=xunit1 \
  "${timeout_flag[@]}" \
  --junitxml="$outdir/junit-gpu.xml" 2>&1 | tee "$outdir/pytest.log"
test_rc=${PIPESTATUS[0]}
[ "$test_rc" -eq 0 ] || status=1

echo "== benchmarks/seed_epilogs.py"
python3 benchmarks/seed_epilogs.py --out "$outdir/seed_epilogs.json" ${SEED_ARGS:-} \
  2>&1 | tee "$outdir/seed_epilogs.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== done: pytest exit $test_rc, overall $status; results in $outdir"
exit $status
