"""One SGD training step of a 784-512-512-10 ReLU MLP, batch 128, float32, on the CPU.

Side by side in one process: fuseflow's NumPy backend, the same step written by hand in
NumPy, and PyTorch CPU eager (if installed). Each variant is timed in interleaved rounds
(so drift in the machine's speed hits all of them alike); we report medians and ratios.

    python benchmarks/cpu_step.py --out benchmarks/results/cpu_step.json
"""

from __future__ import annotations

import os

# PyTorch's OpenMP workers otherwise spin for a while after each op and steal the cores from
# whichever variant runs next; passive waiting makes the side-by-side rounds fair.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _meta import metadata, write_json

import fuseflow as ff

SIZES, BATCH, LR = (784, 512, 512, 10), 128, 0.01


def make_fuseflow(params, x, y):
    model = ff.nn.Serial(ff.nn.Dense(SIZES[1], "relu"), ff.nn.Dense(SIZES[2], "relu"),
                         ff.nn.Dense(SIZES[3]))
    grad_fn = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)
    opt = ff.optim.sgd(LR)
    state = {"params": params, "opt": opt.init(params)}

    def step():
        loss, grads = grad_fn(state["params"], x, y)
        state["params"], state["opt"] = ff.optim.update_and_apply(
            opt, grads, state["opt"], state["params"], donate_grads=True)  # as ff.train does
        return loss
    return step


def make_numpy(params, x, y):
    """The step a careful NumPy programmer writes: no framework, in-place SGD."""
    (w1, b1), (w2, b2), (w3, b3) = [(p["w"].copy(), p["b"].copy()) for p in params]
    rows = np.arange(len(y))

    def step():
        nonlocal w1, b1, w2, b2, w3, b3  # updated in place below
        h1 = x @ w1.T + b1
        m1 = h1 > 0
        h1 *= m1
        h2 = h1 @ w2.T + b2
        m2 = h2 > 0
        h2 *= m2
        z = h2 @ w3.T + b3
        z -= z.max(1, keepdims=True)
        e = np.exp(z)
        s = e.sum(1, keepdims=True)
        loss = (np.log(s[:, 0]) - z[rows, y]).mean()
        d3 = e / s
        d3[rows, y] -= 1
        d3 /= len(y)
        d2 = d3 @ w3
        d2 *= m2
        d1 = d2 @ w2
        d1 *= m1
        w3 -= LR * (d3.T @ h2)
        b3 -= LR * d3.sum(0)
        w2 -= LR * (d2.T @ h1)
        b2 -= LR * d2.sum(0)
        w1 -= LR * (d1.T @ x)
        b1 -= LR * d1.sum(0)
        return loss
    return step


def make_torch(params, x, y):
    import torch

    ps = [torch.tensor(p[k]).requires_grad_() for p in params for k in ("w", "b")]
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.SGD(ps, lr=LR)

    def step():
        h = torch.relu(xt @ ps[0].T + ps[1])
        h = torch.relu(h @ ps[2].T + ps[3])
        loss = torch.nn.functional.cross_entropy(h @ ps[4].T + ps[5], yt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=20, help="steps per timed round")
    ap.add_argument("--out", default="benchmarks/results/cpu_step.json")
    args = ap.parse_args()

    model = ff.nn.Serial(*[ff.nn.Dense(n) for n in SIZES[1:]])
    _, params = model.init(ff.random.key(0), (SIZES[0],))
    rng = np.random.default_rng(0)
    x = rng.random((BATCH, SIZES[0]), dtype=np.float32)
    y = rng.integers(0, SIZES[-1], BATCH)

    variants = {"fuseflow_numpy": make_fuseflow(params, x, y), "hand_numpy": make_numpy(params, x, y)}
    try:
        import torch

        torch.set_num_threads(len(os.sched_getaffinity(0)))
        variants["torch_eager"] = make_torch(params, x, y)
    except ImportError:
        print("PyTorch not installed: skipping torch_eager")

    for step in variants.values():  # warm-up
        for _ in range(5):
            step()
    times = {name: [] for name in variants}
    names = list(variants)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order
            step = variants[name]
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            times[name].append((time.perf_counter() - t0) / args.steps * 1e6)

    med = {name: statistics.median(t) for name, t in times.items()}
    result = {
        "benchmark": "cpu_step", **metadata("torch"),
        "model": "784-512-512-10 ReLU MLP", "batch": BATCH, "optimizer": "sgd", "dtype": "float32",
        "rounds": args.rounds, "steps_per_round": args.steps,
        "median_us": med, "all_us": times,
        "ratio_fuseflow_over_hand_numpy": med["fuseflow_numpy"] / med["hand_numpy"],
    }
    if "torch_eager" in med:
        result["ratio_fuseflow_over_torch"] = med["fuseflow_numpy"] / med["torch_eager"]
    write_json(args.out, result)
    for name, m in med.items():
        print(f"{name:16s} {m:9.1f} us/step  ({m / med['hand_numpy']:.3f}x hand NumPy)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
