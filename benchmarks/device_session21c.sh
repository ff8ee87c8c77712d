#!/usr/bin/env bash
# Eighteenth session, call 87: call 86's side-by-side again after the setting's fix (its
# profiles failed on FUSEFLOW_GRAPH_MEMSETS): the large model's 16-bit steps and the
# medium SGD step with the memset rewrite off ("keep") and on ("kernel"), alternating, two
# rounds. Results: $OUT/results-s21c.tgz.
set -uo pipefail
TAG=s21c
source "$(dirname "$0")/_device_lib.sh"
for r in 1 2; do for v in keep kernel; do
  FUSEFLOW_GRAPH_MEMSETS=$v TAILN=4 run "profile_${v}_$r" 90 python3 benchmarks/profile_step.py \
    --framework fuseflow --out "$res" --tag "${TAG}_${v}_$r" \
    --configs 784-4096-4096-10:adam:16bit,784-4096-4096-10:sgd:16bit,784-1024-1024-10:sgd:fp32
done; done
