"""The optimizer update on the CPU: ``update_and_apply`` against ``opt.update`` followed by
``apply_updates`` (the reference path, whose results it reproduces bit for bit).

Side by side in one process, alternating each round; medians and ratios. Two parameter
sets: the command line's default model (784-512-512-10) and one 6000 x 6000 layer, where
the temporaries of a layer-sized array per operation cost the most.

    python benchmarks/host_update.py --out benchmarks/results/host_update.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _meta import metadata, write_json

import fuseflow as ff

SHAPES = {"784-512-512-10": [(512, 784), (512,), (512, 512), (512,), (10, 512), (10,)],
          "6000x6000": [(6000, 6000), (6000,)]}
OPTIMIZERS = {"sgd": lambda: ff.optim.sgd(1e-3),
              "momentum": lambda: ff.optim.sgd(1e-3, momentum=0.9),
              "adam": lambda: ff.optim.adam(1e-3)}


def reference(opt, grads, state, params):
    updates, state = opt.update(grads, state, params)
    return ff.optim.apply_updates(params, updates), state


def fused(opt, grads, state, params):  # as ff.train.make_step calls it
    return ff.optim.update_and_apply(opt, grads, state, params, donate_grads=True)


def measure(shapes, make_opt, rounds):
    rng = np.random.default_rng(0)
    params = {f"p{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    opt = make_opt()
    variants = {"fused": fused, "reference": reference}
    states = {name: (params, opt.init(params)) for name in variants}
    times = {name: [] for name in variants}
    for r in range(rounds):
        for name in sorted(variants, reverse=bool(r % 2)):
            p, s = states[name]
            grads = {k: v * np.float32(0.5) for k, v in p.items()}
            t0 = time.perf_counter()
            states[name] = variants[name](opt, grads, s, p)
            times[name].append(time.perf_counter() - t0)
    for a, b in zip(ff.tree.leaves(states["fused"]), ff.tree.leaves(states["reference"])):
        np.testing.assert_array_equal(a, b)  # the same bits after every round
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--out", default="benchmarks/results/host_update.json")
    args = ap.parse_args()
    rows = []
    for model, shapes in SHAPES.items():
        rounds = args.rounds if model.startswith("784") else max(5, args.rounds // 4)
        for name, make_opt in OPTIMIZERS.items():
            ms = measure(shapes, make_opt, rounds)
            rows.append({"params": model, "optimizer": name, "rounds": rounds,
                         "fused_ms": round(ms["fused"], 3),
                         "reference_ms": round(ms["reference"], 3),
                         "ratio": round(ms["fused"] / ms["reference"], 3)})
            print(f"{model:15s} {name:9s} fused {ms['fused']:9.3f} ms  reference "
                  f"{ms['reference']:9.3f} ms  {ms['fused'] / ms['reference']:.2f}x", flush=True)
    write_json(args.out, {"meta": metadata(), "rows": rows})


if __name__ == "__main__":
    main()
