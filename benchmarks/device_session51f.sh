#!/usr/bin/env bash
# Forty-eighth session, last call: is the 16-bit large step faster with every matmul tuned
# (FUSEFLOW_AUTOTUNE=1: cuBLASLt's candidates timed at compile) than with "auto" (float32
# only, the default), on an H100 in bfloat16? The default's evidence is the H200's float16
# (calls 9 and 28). Four fuseflow processes, alternating; --no-mnist.
# Results: $OUT/results-s51f.tgz.
set -uo pipefail
TAG=${TAG:-s51f}
source "$(dirname "$0")/_device_lib.sh"
for r in 1 2; do for a in auto 1; do
  FUSEFLOW_AUTOTUNE=$a TAILN=3 peers "peers_fuseflow_tune${a}_$r" 60 --worker fuseflow \
    --tag "${TAG}_tune${a}_$r" --models 784-4096-4096-10 --precisions 16bit --no-mnist
done; done
