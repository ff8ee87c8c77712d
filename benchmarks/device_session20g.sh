#!/usr/bin/env bash
# Seventeenth session, call 84: L2 persistence on by default ("auto": where the donated
# arrays fit the L2 set-aside): its tests, MNIST epochs and steps with it on and off once
# more, the CLI on the GPU, and the fuseflow side of peers.py at the defaults (large model
# and memory unchanged?). Results: $OUT/results-s20g.tgz.
set -uo pipefail
TAG=s20g
source "$(dirname "$0")/_device_lib.sh"
TAILN=4 run pytest_compile 90 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_compile.py
TAILN=12 run step_overhead_probe 60 python3 benchmarks/step_overhead_probe.py --out "$res" \
  --data-dir .devdata/mnist --variants in_graph+tail,in_graph+tail+l2
cli_runs 40
TAILN=4 peers peers_fuseflow 70 --worker fuseflow --tag s20g
