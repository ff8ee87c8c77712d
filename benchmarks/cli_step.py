"""The command line's training step (784-512-512-10 ReLU, Adam 1e-3 cosine, batch 128) as
``ff.train`` compiles it, float32 and float16 mixed precision, on the GPU.

    python benchmarks/cli_step.py --out DIR

For each variant: us per compiled call in a loop (what ``fit`` sees, host included), the
graph replay alone (CUDA events around 200 back-to-back replays), both as medians of 7
rounds that take the variants in turn; whether the calls took the compiled step's fast
path, and which fused kernels the step was built from. The float16
step runs twice: as ``make_step`` builds it (the scaled 16-bit gradients go into the
update) and with the float32 gradients unscaled first (the previous form). JSON out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402
from peers import median_step_us  # noqa: E402


def build(ff, variant):
    model = ff.nn.Serial(ff.nn.Dense(512, "relu"), ff.nn.Dense(512, "relu"), ff.nn.Dense(10))
    _, params = model.init(ff.random.key(0), (784,))
    params = ff.device_put(params, "cuda")
    opt = ff.optim.adam(ff.optim.cosine_decay_schedule(1e-3, 2340))
    loss = ff.losses.softmax_cross_entropy
    if variant == "float32":
        return ff.train.make_step(model, loss, opt), params, opt
    opt = ff.mixed_precision.dynamic_loss_scaling(opt)
    if variant == "float16":
        return ff.train.make_step(model, loss, opt, compute_dtype="float16"), params, opt
    grad_fn = ff.mixed_precision.value_and_grad(model, loss, with_outputs=True)

    def step(p, s, x, y):  # make_step's float16 step, float32 grads unscaled first
        (value, out), g = grad_fn(p, x, y, loss_scale=s.scale)
        p, s = ff.optim.update_and_apply(opt, g, s, p, donate_grads=True)
        return p, s, {"loss": value, "accuracy": ff.losses.accuracy(out, y)}
    return step, params, opt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import cupy as cp

    import fuseflow as ff

    rng = cp.random.default_rng(0)
    x = rng.random((128, 784), dtype=cp.float32)
    y = rng.integers(0, 10, 128).astype(cp.int64)
    variants = ("float32", "float16", "float16, unscaled first")
    runs, rows = {}, []
    for variant in variants:  # compile all three first, then time them interleaved
        step, params, opt = build(ff, variant)
        be = ff.backend.get("cuda")
        be.reset_stats()
        compiled = ff.compile(step)
        state = [params, opt.init(params)]

        def call(compiled=compiled, state=state):
            state[0], state[1], _ = compiled(state[0], state[1], x, y)

        call()
        calls = {k: v for k, v in be.stats()["calls"].items()
                 if k.startswith(("multi_tensor", "all_finite", "next_loss"))}
        runs[variant] = (compiled, call, calls)
    stream = cp.cuda.get_current_stream()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    host, replay = {v: [] for v in variants}, {v: [] for v in variants}
    for _ in range(7):
        for variant in variants:
            compiled, call, _ = runs[variant]
            host[variant].append(median_step_us(call, cp.cuda.Device().synchronize, 200, 1))
            graph = next(iter(compiled._graphs.values())).graph
            start.record(stream)
            for _ in range(200):
                graph.launch(stream)
            stop.record(stream)
            stop.synchronize()
            replay[variant].append(cp.cuda.get_elapsed_time(start, stop) * 1e3 / 200)
    for variant in variants:
        compiled, _, calls = runs[variant]
        rows.append({"variant": variant, "us_per_call": float(np.median(host[variant])),
                     "graph_replay_us": float(np.median(replay[variant])),
                     "graph_replay_us_rounds": replay[variant],
                     "fast_path": compiled._last is not None, "compiles": compiled.compiles,
                     "fused_calls_while_compiling": calls})
        print(json.dumps(rows[-1]), flush=True)
    write_json(os.path.join(args.out, "cli_step.json"),
               {"benchmark": "cli_step", **metadata("cupy", "nvmath"), "rows": rows})


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
