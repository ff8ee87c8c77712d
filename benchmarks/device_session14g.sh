#!/usr/bin/env bash
# The eleventh session's last call: benchmarks/fp64_probe.py after it took its shapes from
# gemm_sweep.py, and the layer GPU tests on the final commit. Results: $OUT/results-s14g.tgz.
set -uo pipefail
TAG=s14g
source "$(dirname "$0")/_device_lib.sh"
TAILN=8 run fp64_probe_final 60 python3 benchmarks/fp64_probe.py --out "$res" --name fp64_probe_final
TAILN=4 run pytest_gpu_layers 90 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_gpu_layers.py
