#!/usr/bin/env bash
# Forty-ninth session, first call: the 16-bit step's share of the matmul rate with the
# references in the same process (interleaved_16bit.py: fuseflow's and JAX's bf16 Adam
# steps and the plain 8192^3 matmuls in alternating 1.5 s windows, clocks sampled), in two
# processes; then peers.py's way, one fuseflow and one JAX process (16-bit large only), for
# comparison. On the H200 (not reached since call 193) the whole matrix runs instead of
# the second interleaved process and the peers pair.
# Results: $OUT/results-$TAG.tgz.
set -uo pipefail
TAG=${TAG:-s52a}
source "$(dirname "$0")/_device_lib.sh"
interleaved() { interleaved_16bit "interleaved_$1" 240 --tag "${TAG}_$1" --rounds 3 --window 1.5; }
interleaved 1
if grep -q H200 "$res/env.txt"; then
  whole_matrix
else
  interleaved 2
  pair_16bit 90
fi
