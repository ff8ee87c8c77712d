#!/usr/bin/env bash
# Twenty-fifth session's first call, prepared without a device (none was lent): the batch
# cast in the graph's copy (ff.compile's cast_args, on by default for mixed-precision steps
# in fit, `fuseflow bench`, peers.py and profile_step.py). Its GPU tests (every conversion
# against astype, the compiled step with and without, in the graph's copy and not, fit in
# float16) and the copy kernel's older tests; the compiled 16-bit steps with the cast in the
# copy and at the graph's start (settings_ab.py, 6 alternating rounds, two batches a
# step); the 16-bit Adam step's timeline. Results: $OUT/results-s28a.tgz.
set -uo pipefail
TAG=s28a
source "$(dirname "$0")/_device_lib.sh"
TAILN=10 run pytest_cast 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
  tests/test_compile_cast.py tests/test_compile.py -k "cast or batch or copies or copy"
ab cast_in_copy 240 6 _cuda_graph_inputs.CAST_IN_COPY=True _cuda_graph_inputs.CAST_IN_COPY=False
TAILN=3 run profile_16bit 90 python3 benchmarks/profile_step.py --framework fuseflow \
  --out "$res" --tag s28a --configs 784-4096-4096-10:adam:16bit
