"""Do the overlap scope's two safeguards matter? (GPU; JSON out.)

``_cuda_overlap.OverlapScope`` keeps the side stream's inputs alive until its join, and joins
before the backward returns. This script breaks each safeguard in turn and reports how far
the weight gradients then move from the one-stream result, on a model where a missing one
should show (equal widths: the input gradient reuses a freed input's memory; a long weight
gradient: the side stream is still running when the grads are read). The intact scope must
give 0; a broken one that also gives 0 on this GPU means the test suite could not see that
breakage either.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _meta import metadata, write_json  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    import cupy as cp

    import fuseflow as ff
    from fuseflow import nn
    from fuseflow.backend import _cuda_overlap

    be = ff.backend.get("cuda")
    model = nn.Serial(nn.Dense(2048, "relu"), nn.Dense(2048, "relu"), nn.Dense(2048, "relu"),
                      nn.Dense(30))
    _, params = model.init(ff.random.key(1), (2048,))
    params = ff.device_put(params, "cuda")
    rng = np.random.default_rng(2)
    x = cp.asarray(rng.standard_normal((4096, 2048), dtype=np.float32))
    y = cp.asarray(rng.integers(0, 30, 4096))
    grad_fn = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)

    def grads():
        _, g = grad_fn(params, x, y)
        return [cp.asnumpy(a) for a in ff.tree.leaves(g)]  # read at once

    be.overlap_wgrad = False
    reference = grads()
    be.overlap_wgrad = True
    scope = _cuda_overlap.OverlapScope
    intact_fork, intact_join = scope.fork, scope.join

    def fork_without_keeping(self, *reads):
        return intact_fork(self)

    def join_without_waiting(self):
        self._forks.clear()
        self._keep.clear()

    variants = {"intact": (intact_fork, intact_join),
                "inputs_not_kept": (fork_without_keeping, intact_join),
                "no_join": (intact_fork, join_without_waiting)}
    rows = []
    for name, (fork, join) in variants.items():
        scope.fork, scope.join = fork, join
        diffs = []
        for _ in range(args.repeats):
            got = grads()
            diffs.append(max(float(np.max(np.abs(a - b))) for a, b in zip(got, reference)))
            cp.cuda.Device().synchronize()
        scope.fork, scope.join = intact_fork, intact_join
        row = {"variant": name, "max_abs_diff": diffs}
        rows.append(row)
        print(row, flush=True)
    write_json(os.path.join(args.out, "overlap_check.json"),
               {"benchmark": "overlap_check", **metadata("cupy", "nvmath"), "rows": rows})


if __name__ == "__main__":
    main()
