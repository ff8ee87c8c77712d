"""What Dropout costs in a compiled step (``ff.compile``): the medium MLP with and without it.

    python benchmarks/dropout_step.py --out DIR [--rounds 3]

784-1024-1024-10 (ReLU) at batch 256, Adam 1e-3, full float32; "dropout" puts
``Dropout(0.1)`` after each hidden layer (its mask drawn on the GPU from a key argument,
``ff.random.bits``). Each variant: a fresh compiled step, the median over 7 blocks of 200
back-to-back calls on two alternating batches, alternating variants over rounds. Keys:
"fixed" hands every call the same device key (the GPU cost alone); "per step" derives a new
key per call on the host and moves it to the GPU (``fold_in`` + ``device_put``), as
``ff.train.fit`` does. JSON out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402
from peers import median_step_us  # noqa: E402

VARIANTS = ("no dropout", "dropout, fixed key", "dropout, key per step")


def step_us(ff, cp, variant):
    nn = ff.nn
    layers = [nn.Dense(1024, "relu"), nn.Dense(1024, "relu"), nn.Dense(10)]
    if variant != "no dropout":
        layers = [layers[0], nn.Dropout(0.1), layers[1], nn.Dropout(0.1), layers[2]]
    model = nn.Serial(*layers)
    _, params = model.init(ff.random.key(0), (784,))
    opt = ff.optim.adam(1e-3)
    grad_fn = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)

    def step(p, s, x, y, k):
        loss, g = grad_fn(p, x, y, key=k)
        p, s = ff.optim.update_and_apply(opt, g, s, p)
        return p, s, loss

    compiled = ff.compile(step)
    data = [(cp.random.random((256, 784), dtype=cp.float32),
             cp.random.randint(0, 10, 256).astype(cp.int64)) for _ in range(2)]
    base = ff.random.key(1)
    fixed = ff.device_put(base, "cuda")
    st = {"p": ff.device_put(params, "cuda"), "s": None, "i": 0, "loss": None}
    st["s"] = opt.init(st["p"])

    def call():
        x, y = data[st["i"] % 2]
        k = ff.device_put(ff.random.fold_in(base, st["i"]), "cuda") \
            if variant == "dropout, key per step" else fixed
        st["i"] += 1
        st["p"], st["s"], st["loss"] = compiled(st["p"], st["s"], x, y, k)

    for _ in range(5):
        call()
    us = median_step_us(call, cp.cuda.Device().synchronize, 200, 7)
    loss = float(st["loss"])
    compiled = st = None
    cp.get_default_memory_pool().free_all_blocks()
    return us, loss


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import cupy as cp

    import fuseflow as ff

    rows = []
    for r in range(args.rounds):
        for variant in VARIANTS:
            us, loss = step_us(ff, cp, variant)
            row = {"round": r, "variant": variant, "us": round(us, 2), "loss": loss}
            print(json.dumps(row), flush=True)
            rows.append(row)
    summary = {v: round(statistics.median(x["us"] for x in rows if x["variant"] == v), 2)
               for v in VARIANTS}
    print(json.dumps(summary), flush=True)
    write_json(Path(args.out) / "dropout_step.json",
               {**metadata("cupy", "nvmath"), "benchmark": "dropout_step",
                "model": "784-1024-1024-10, batch 256, adam, fp32", "rows": rows,
                "median_us": summary})


if __name__ == "__main__":
    main()
