"""Several training steps in one compiled call (one CUDA graph) against one step a call.

    python benchmarks/multistep_probe.py --out DIR [--steps-per-call 1,2,4,8] [--rounds 3]

A compiled step replays one graph a call; between two replays the GPU may idle while the
next graph's first node is scheduled. A step function that runs k steps over a stacked
batch ``(k, batch, features)`` compiles to one graph of k steps, as JAX's epoch is one
``lax.scan``. For the medium model (784-1024-1024-10, batch 256, full float32, SGD and
Adam) this times us per training step at each k, the arms alternating over rounds (the
median over 7 blocks of back-to-back calls, as ``settings_ab.py``), and checks that k
steps in one call give the losses of k calls of one step. JSON out
(``multistep_probe.json``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402
from peers import MODELS, fuseflow_step, median_step_us  # noqa: E402


def k_steps(step, k):
    """``step`` run k times over the leading axis of stacked batches ``xs``, ``ys``; the
    third output is the list of the k steps' metrics."""
    def run(p, s, xs, ys):
        metrics = []
        for i in range(k):
            p, s, m = step(p, s, xs[i], ys[i])
            metrics.append(m)
        return p, s, metrics
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps-per-call", default="1,2,4,8")
    ap.add_argument("--optimizers", default="sgd,adam")
    ap.add_argument("--model", default="784-1024-1024-10")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import cupy as cp

    import fuseflow as ff

    ks = [int(k) for k in args.steps_per_call.split(",")]
    sizes, batch = MODELS[args.model]
    kmax = max(ks)
    rng = cp.random.default_rng(0)
    xs = rng.random((kmax, batch, sizes[0]), dtype=cp.float32)
    ys = rng.integers(0, sizes[-1], (kmax, batch)).astype(cp.int64)
    rows, summary = [], []
    for opt_name in args.optimizers.split(","):
        times = {k: [] for k in ks}
        check = {}
        for r in range(args.rounds):
            order = ks if r % 2 == 0 else ks[::-1]
            for k in order:
                _, params, state, step, _, _ = fuseflow_step(ff, cp, sizes, batch, opt_name,
                                                             "fp32")
                compiled = ff.compile(k_steps(step, k))
                st = {"p": params, "s": state}
                xk, yk = xs[:k], ys[:k]

                def call():
                    st["p"], st["s"], st["l"] = compiled(st["p"], st["s"], xk, yk)

                call()  # compile, then the first k steps' losses
                if r == 0:
                    check[k] = [float(v) for v in st["l"]]
                for _ in range(4):
                    call()
                blocks = max(1, 200 // k)
                us = median_step_us(call, cp.cuda.Device().synchronize, blocks, 7) / k
                times[k].append(us)
                rows.append({"round": r + 1, "optimizer": opt_name, "steps_per_call": k,
                             "us_per_step": us})
                print(rows[-1], flush=True)
                compiled = st = None
                cp.get_default_memory_pool().free_all_blocks()
        # k steps in one call from the same start must give the one-step calls' losses
        ref = []
        _, params, state, step, _, _ = fuseflow_step(ff, cp, sizes, batch, opt_name, "fp32")
        one = ff.compile(step)
        for i in range(kmax):
            params, state, loss = one(params, state, xs[i], ys[i])
            ref.append(float(loss))
        med = {k: statistics.median(v) for k, v in times.items()}
        summary.append({"optimizer": opt_name, "median_us_per_step": med,
                        "ratio_to_k1": {k: med[k] / med[ks[0]] for k in ks},
                        "first_losses": check, "one_step_losses": ref,
                        "losses_equal": all(check[k] == ref[:k] for k in ks)})
        print(summary[-1], flush=True)
    out = Path(args.out)
    write_json(out / "multistep_probe.json",
               {**metadata("cupy"), "model": args.model, "batch": batch,
                "precision": "fp32", "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
