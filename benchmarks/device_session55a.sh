#!/usr/bin/env bash
# Fifty-second session, first call, asked of nvidia-h200: on an H200, the whole matrix
# and the 16-bit pairings (device_session54a.sh); on any other GPU, the one-pass output
# layer's three forms (device_session55b.sh), so that the machine's start is not spent
# for nothing. Results: $OUT/results-$TAG.tgz.
set -uo pipefail
here="$(dirname "$0")"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  exec bash "$here/device_session54a.sh"
fi
exec bash "$here/device_session55b.sh"
