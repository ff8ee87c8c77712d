"""The fused optimizer update of the medium model (784-1024-1024-10, 1.86 M float32 params):
elements per thread and grid caps, alone and inside the compiled step.

    python benchmarks/update_probe.py --out DIR [--rounds 3]

Part 1: ``_cuda_fused.multi_tensor_update`` in place (as inside ``ff.compile``) for Adam
and SGD, timed like a compiled step runs it (20 calls in one CUDA graph, median over
replays), with ``VECTOR_BYTES`` 16 (4 float32 per thread, the default) or 32 (8) and
``BLOCKS_PER_SM`` uncapped (one vector per thread, the default) or capped (a grid-stride
loop over 132 x cap blocks of 256), with the bytes it must move and the rate. Part 2: the
compiled medium Adam step under each variant, alternating over rounds. JSON out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402
from peers import compiled_step_us  # noqa: E402
from skinny_sweep import graph_us  # noqa: E402

UNCAPPED = 2 ** 20
VARIANTS = [(16, UNCAPPED), (32, UNCAPPED), (16, 4), (16, 8), (32, 4), (32, 8), (16, 16)]
SHAPES = [(1024, 784), (1024,), (1024, 1024), (1024,), (10, 1024), (10,)]


def kernel_rows(cp, F):
    rng = cp.random.default_rng(0)
    params = [rng.standard_normal(s, dtype=np.float32) for s in SHAPES]
    grads = [rng.standard_normal(s, dtype=np.float32) * 1e-2 for s in SHAPES]
    m = [rng.standard_normal(s, dtype=np.float32) * 1e-3 for s in SHAPES]
    v = [rng.random(s, dtype=np.float32) * 1e-4 for s in SHAPES]
    count = cp.asarray(7, dtype=cp.int32)
    n = sum(int(p.size) for p in params)
    rows = []
    for vb, cap in VARIANTS:
        F.VECTOR_BYTES, F.BLOCKS_PER_SM = vb, cap
        for kind, states, arrays in (("adam", [m, v], 7), ("sgd", [], 3)):
            hyper = dict(b1=0.9, b2=0.999, eps=1e-8, count=count) if kind == "adam" else {}
            us = graph_us(lambda kind=kind, states=states, hyper=hyper: F.multi_tensor_update(
                kind, params, grads, states, step_const=-1e-9, in_place=True, **hyper))
            row = {"kind": kind, "vector_bytes": vb,
                   "blocks_per_sm": None if cap == UNCAPPED else cap, "us": round(us, 2),
                   "bytes": arrays * 4 * n, "gb_per_s": round(arrays * 4 * n / us / 1e3, 1)}
            rows.append(row)
            print(row, flush=True)
    return rows


def step_rows(cp, ff, F, rounds):
    rows = []
    for r in range(rounds):
        for vb, cap in VARIANTS[:4]:
            F.VECTOR_BYTES, F.BLOCKS_PER_SM = vb, cap
            us, loss = compiled_step_us(ff, cp, "784-1024-1024-10", "adam")
            row = {"round": r + 1, "optimizer": "adam", "vector_bytes": vb,
                   "blocks_per_sm": None if cap == UNCAPPED else cap, "step_us": round(us, 2),
                   "loss": loss}
            rows.append(row)
            print(row, flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import cupy as cp

    import fuseflow as ff
    from fuseflow.backend import _cuda_fused as F

    default = F.VECTOR_BYTES, F.BLOCKS_PER_SM
    payload = {**metadata("cupy", "nvmath", "fuseflow"), "benchmark": "update_probe",
               "params": int(sum(np.prod(s) for s in SHAPES))}
    payload["kernels"] = kernel_rows(cp, F)
    write_json(Path(args.out) / "update_probe.json", payload)
    ff.backend.get("cuda").tf32 = False
    payload["steps"] = step_rows(cp, ff, F, args.rounds)
    F.VECTOR_BYTES, F.BLOCKS_PER_SM = default
    write_json(Path(args.out) / "update_probe.json", payload)


if __name__ == "__main__":
    main()
