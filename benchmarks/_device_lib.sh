# Sourced by the device scripts: environment, the results folder $res, and
#   run NAME SECONDS CMD...   (CMD's output in $res/NAME.log, its tail printed; afterwards
#                              $res is packed into $OUT/results-$TAG.tgz, so a call stopped
#                              by its time limit still returns every finished step)
#   peers NAME SECONDS ARGS... benchmarks/peers.py ARGS, its JSON in $res, real MNIST
#   paired98 NAME SECONDS WORKER TAG  peers.py's medium fp32 steps and time to 98% over
#                              20 seeds from the shared start (--mnist-start shared), for
#                              WORKER (fuseflow or jax; FUSEFLOW_* settings from the caller)
#   wgmma_tests SECONDS        the wgmma kernel's GPU tests (tests/test_wgmma.py)
#   peer_rounds SECONDS PRECS  peers.py's steps of all three models in PRECS (e.g. fp32,tf32),
#                              fuseflow then JAX, twice (JSON tagged ${TAG}_1, ${TAG}_2; --no-mnist)
#   wgmma_splits_steps S1 S2 S3 S4  the wgmma kernel's GPU tests (S1 s); the compiled medium
#                              fp32 steps off / rounded / lotrunc / chopped side by side
#                              (settings_ab.py, three rounds, S2 s); paired98 for fuseflow
#                              lotrunc and rounded (S3 s each) and JAX (S4 s)
#   gpu_tests NAME SECONDS EXPR  the GPU tests of the backend, optimizers and compile
#                              selected by the -k expression EXPR
#   interleaved_16bit NAME SECONDS ARGS...  benchmarks/interleaved_16bit.py ARGS, its JSON and
#                              clock samples in $res (calls 212-213)
#   pair_16bit SECONDS         peers.py's 16-bit large steps, one fuseflow and one JAX process
#                              (JSON tagged ${TAG}_large; --no-mnist)
#   whole_matrix               every framework of the issue's matrix, one process each in
#                              the order fuseflow, the hand-written nvmath pattern, torch,
#                              JAX (fuseflow and JAX with time to 98%), then cli_runs 60
#                              (call 168's device_session39c.sh, calls 205/207/210)
#   cli_runs SECONDS           fuseflow train on the GPU in float32 and float16 (checkpoints
#                              in /tmp/r32, /tmp/r16; their metrics.jsonl copied to $res)
#   ab NAME SECONDS ROUNDS ARM...  settings_ab.py: the compiled 16-bit large steps under
#                              each ARM (a --setting value), ROUNDS alternating rounds
#   all_gpu_tests SECONDS      every GPU test but the kernel sources' (4 xdist workers)
#   gpu_groups S1 S2           every GPU test but the kernel sources' in call 158's two groups
#                              (backend, compile, checkpoint, DRELU tail; the rest), 6 xdist workers
#   gpu_heavy SECONDS          the first of those groups alone
#   gpu_rest SECONDS           the second alone
#   spread_16bit SECONDS       the 16-bit large Adam step four times and JAX's twice,
#                              alternating (JSON tagged ${TAG}_large_N, JAX paired with
#                              fuseflow's 2 and 4), the GPU's clocks, temperature and
#                              power sampled around each process (clocks_*.csv)
#   xdist MODE [N]             "-n N --dist MODE" (N: 4) where pytest-xdist is importable (its
#                              wheels in .whl: pip download pytest-xdist execnet --no-deps
#                              -d .whl), else nothing: the tests then run in one process
#   profile_f64_ab CONFIGS     profile_step.py on CONFIGS, the own matmul's float64 form off
#                              (cublas) and on (f64), alternating, two rounds (logs and JSON
#                              named by form and round; calls 65 and 67 named theirs by form
#                              and the script's clock)
cd "$(dirname "${BASH_SOURCE[0]}")/.."
res=/tmp/ffres-$TAG; rm -rf "$res"; mkdir -p "$res"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MPLBACKEND=Agg
export PYTHONPATH=".:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" FUSEFLOW_DATA="$PWD/.devdata"
run() { local name=$1 limit=$2; shift 2; echo "== $name"; local t0=$SECONDS
  timeout "$limit" "$@" > "$res/$name.log" 2>&1; echo "rc=$? seconds=$((SECONDS - t0))" | tee -a "$res/$name.log"
  tail -n "${TAILN:-6}" "$res/$name.log"; tar czf "$OUT/results-$TAG.tgz" -C "$res" .; }
peers() { local name=$1 limit=$2; shift 2
  run "$name" "$limit" python3 benchmarks/peers.py --out "$res" --data-dir .devdata/mnist "$@"; }
paired98() { local name=$1 limit=$2 worker=$3 tag=$4
  TAILN=4 peers "$name" "$limit" --worker "$worker" --tag "$tag" --models 784-1024-1024-10 \
    --precisions fp32 --mnist-start shared --mnist-seeds 20; }
wgmma_tests() { TAILN=8 run pytest_wgmma "$1" python3 -m pytest -m gpu -q -rfE \
  -p no:cacheprovider tests/test_wgmma.py; }
peer_rounds() { local limit=$1 precisions=$2 r w
  for r in 1 2; do for w in fuseflow jax; do
    TAILN=13 peers "peers_${w}_$r" "$limit" --worker "$w" --tag "${TAG}_$r" \
      --models 784-30-10,784-1024-1024-10,784-4096-4096-10 --precisions "$precisions" --no-mnist
  done; done; }
wgmma_splits_steps() { local split
  wgmma_tests "$1"
  TAILN=4 run ab_splits "$2" python3 benchmarks/settings_ab.py --out "$res" --name splits_medium \
    --setting fp32_wgmma=off --setting fp32_wgmma=3xtf32 --setting fp32_wgmma=3xtf32-lotrunc \
    --setting fp32_wgmma=3xtf32-chop \
    --config 784-1024-1024-10:sgd:fp32 --config 784-1024-1024-10:adam:fp32 --rounds 3
  for split in 3xtf32-lotrunc 3xtf32; do
    FUSEFLOW_FP32_WGMMA=$split paired98 "peers_fuseflow_$split" "$3" fuseflow "${TAG}_$split"
  done
  paired98 peers_jax_shared "$4" jax "${TAG}_jax"; }
gpu_tests() { TAILN=15 run "$1" "$2" python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_gpu_backend.py tests/test_fused_optim.py tests/test_compile.py -k "$3"; }
xdist() { python3 -c "import xdist" 2>/dev/null && echo "-n ${2:-4} --dist $1"; }
ab() { local name=$1 limit=$2 rounds=$3 arm; shift 3; local arms=()
  for arm in "$@"; do arms+=(--setting "$arm"); done
  TAILN=6 run "ab_$name" "$limit" python3 benchmarks/settings_ab.py --out "$res" --name "$name" \
    "${arms[@]}" --rounds "$rounds"; }
all_gpu_tests() { TAILN=25 run pytest_gpu_all "$1" python3 -m pytest -m gpu -q -rfE \
  -p no:cacheprovider $(xdist load) tests --ignore=tests/test_kernel_sources.py; }
clocks() { nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv,noheader >> "$res/clocks_$1.csv" 2>&1; }
spread_16bit() { local limit=$1 r w
  for r in 1 2 3 4; do for w in fuseflow jax; do
    if [ "$w" = jax ] && [ $((r % 2)) = 1 ]; then continue; fi
    clocks "${w}_$r"
    TAILN=2 peers "peers_${w}_large_$r" "$limit" --worker "$w" --tag "${TAG}_large_$r" \
      --models 784-4096-4096-10 --precisions 16bit --no-mnist
    clocks "${w}_$r"
  done; done; }
interleaved_16bit() { local name=$1 limit=$2; shift 2
  TAILN=16 run "$name" "$limit" python3 benchmarks/interleaved_16bit.py --out "$res" "$@"; }
pair_16bit() { local w; for w in fuseflow jax; do
    TAILN=2 peers "peers_${w}_large" "$1" --worker "$w" --tag "${TAG}_large" \
      --models 784-4096-4096-10 --precisions 16bit --no-mnist
  done; }
cli_runs() { local limit=$1
  TAILN=8 run train_cuda_fp32 "$limit" python3 -m fuseflow train --backend cuda --data-dir .devdata/mnist --out /tmp/r32 --no-progress
  TAILN=8 run train_cuda_fp16 "$limit" python3 -m fuseflow train --backend cuda --precision float16 --data-dir .devdata/mnist --out /tmp/r16 --no-progress
  cp /tmp/r32/metrics.jsonl "$res/train_cuda_fp32_metrics.jsonl"; cp /tmp/r16/metrics.jsonl "$res/train_cuda_fp16_metrics.jsonl"
  tar czf "$OUT/results-$TAG.tgz" -C "$res" .; }
whole_matrix() {
  TAILN=6 peers peers_fuseflow 120 --worker fuseflow --tag "$TAG"
  TAILN=4 peers peers_hand_nvmath 100 --no-mnist --worker hand_nvmath --tag "$TAG"
  TAILN=4 peers peers_torch 200 --no-mnist --worker torch --tag "$TAG"
  TAILN=6 peers peers_jax 200 --worker jax --tag "$TAG"
  cli_runs 60; }
profile_f64_ab() { local configs=$1 r v
  for r in 1 2; do for v in cublas f64; do
    if [ "$v" = f64 ]; then export FUSEFLOW_OWN_GEMM_MAX_MACS=1099511627776 FUSEFLOW_OWN_GEMM_MMA=f64
    else unset FUSEFLOW_OWN_GEMM_MAX_MACS FUSEFLOW_OWN_GEMM_MMA; fi
    TAILN=3 run "profile_${v}_$r" 60 python3 benchmarks/profile_step.py --framework fuseflow \
      --out "$res" --tag "${TAG}_${v}_$r" --configs "$configs"
  done; done
  unset FUSEFLOW_OWN_GEMM_MAX_MACS FUSEFLOW_OWN_GEMM_MMA; }
HEAVY_TESTS="tests/test_gpu_backend.py tests/test_compile.py tests/test_checkpoint.py tests/test_drelu_tail.py"
gpu_heavy() { TAILN=12 run pytest_gpu_heavy "$1" python3 -m pytest -m gpu -q -rfE \
  -p no:cacheprovider $(xdist load 6) $HEAVY_TESTS; }
gpu_rest() { local f; TAILN=12 run pytest_gpu_rest "$1" python3 -m pytest -m gpu -q -rfE \
  -p no:cacheprovider $(xdist load 6) tests --ignore=tests/test_kernel_sources.py \
  $(for f in $HEAVY_TESTS; do echo "--ignore=$f"; done); }
gpu_groups() { gpu_heavy "$1"; gpu_rest "$2"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$res/env.txt" 2>&1
