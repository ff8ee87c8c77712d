#!/usr/bin/env bash
# Thirty-third session, meant for an H200 (call 138 got an H100): device_session36a.sh's
# runs again (the moved comparison's GPU tests, the whole matrix, the CLI, the 16-bit
# spread), tagged s36b. Results: $OUT/results-s36b.tgz.
TAG=s36b exec bash "$(dirname "$0")/device_session36a.sh"
