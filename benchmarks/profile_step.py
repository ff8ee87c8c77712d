"""Where the GPU time of one training step goes: every kernel of fuseflow's compiled step
or of JAX's jitted step, timed by CUPTI (through torch.profiler, which traces every kernel of
the process, whoever launched it, including CUDA-graph replays).

    python benchmarks/profile_step.py --framework fuseflow --out DIR
    python benchmarks/profile_step.py --framework jax --out DIR

For each configuration: the kernels of one step in launch order with their median
durations, the summed kernel time, the step period on the GPU (start of step k+1 minus
start of step k), and the host time of one call (calls issued back to back, no sync).
The GPU idle time of a step is its period minus its kernel time. JSON out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402
import peers  # noqa: E402
from peers import (FUSEFLOW_LOW, JAX_PRECISION, MODELS, fuseflow_casts,  # noqa: E402
                   fuseflow_step, jax_step)

DEFAULT_CONFIGS = ("784-30-10:sgd:fp32,784-30-10:adam:fp32,784-1024-1024-10:sgd:fp32,"
                   "784-1024-1024-10:adam:fp32,784-4096-4096-10:adam:fp32,"
                   "784-4096-4096-10:adam:16bit")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def gpu_events(run, steps):
    """Chrome-trace GPU events (name, start us, duration us, stream) of ``run()``, in start
    order."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    ev = [(e["name"], float(e["ts"]), float(e.get("dur", 0.0)),
           (e.get("args") or {}).get("stream", e.get("tid")))
          for e in trace.get("traceEvents", [])
          if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    return sorted(ev, key=lambda e: e[1])


def summarize(events, steps):
    """Per-step kernel table, assuming every step launches the same sequence: each kernel's
    median duration, and its median start after the step's first kernel and its stream (the
    timeline: which kernels overlap)."""
    n = len(events) // steps if steps else 0
    if n == 0 or len(events) % steps:
        return {"error": f"{len(events)} GPU events for {steps} steps: not a whole number per "
                         "step", "events": [(e[0], round(e[1], 1), round(e[2], 2)) for e in events[:200]]}
    per_step = [events[k * n:(k + 1) * n] for k in range(steps)]
    table = []
    for i in range(n):
        durs = [s[i][2] for s in per_step]
        starts = [s[i][1] - s[0][1] for s in per_step]
        table.append({"name": per_step[0][i][0][:160], "us": round(statistics.median(durs), 2),
                      "start_us": round(statistics.median(starts), 2),
                      "stream": per_step[0][i][3]})
    starts = [s[0][1] for s in per_step]
    periods = [b - a for a, b in zip(starts, starts[1:])]
    busy = [sum(e[2] for e in s) for s in per_step]
    span = [s[-1][1] + s[-1][2] - s[0][1] for s in per_step]
    return {"kernels_per_step": n, "kernel_us": round(statistics.median(busy), 2),
            "span_us": round(statistics.median(span), 2),
            "period_us": round(statistics.median(periods), 2) if periods else None,
            "kernels": table}


def host_call_us(call, sync, steps):
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        call()
    host = (time.perf_counter() - t0) / steps * 1e6
    sync()
    return host


def parse_configs(text):
    out = []
    for item in text.split(","):
        model, opt, prec = item.split(":")
        out.append((model, opt, prec))
    return out


def profile_fuseflow(configs, steps):
    import cupy as cp

    import fuseflow as ff

    be = ff.backend.get("cuda")
    sync = cp.cuda.Device().synchronize
    results = []
    for model, opt, prec in configs:
        sizes, batch = MODELS[model]
        be.tf32 = prec == "tf32"
        fprec = FUSEFLOW_LOW[0] if prec == "16bit" else prec  # peers.py's 16-bit dtype
        _, params, state, step, x, y = fuseflow_step(ff, cp, sizes, batch, opt, fprec)
        compiled = ff.compile(step, cast_args=fuseflow_casts(fprec))
        st = {"p": params, "s": state}

        def call():
            st["p"], st["s"], _ = compiled(st["p"], st["s"], x, y)

        for _ in range(3):
            call()
        sync()
        host = host_call_us(call, sync, steps)
        g = compiled._last or next(iter(compiled._graphs.values()))

        def replay():
            for _ in range(steps):
                g.capture.launch(g.graph)
        sync()
        t0 = time.perf_counter()
        replay()
        sync()
        replay_us = (time.perf_counter() - t0) / steps * 1e6

        def run():
            for _ in range(steps):
                call()
        row = {"framework": "fuseflow", "model": model, "optimizer": opt, "precision": prec,
               "compute": fprec, "activation": peers.ACTIVATION[0],
               "host_call_us": round(host, 2), "graph_replay_us": round(replay_us, 2),
               **summarize(gpu_events(run, steps), steps)}
        results.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "kernels"}), flush=True)
        compiled = st = None
        cp.get_default_memory_pool().free_all_blocks()
    return results


def profile_jax(configs, steps):
    import jax

    results = []
    for model, opt, prec in configs:
        sizes, batch = MODELS[model]
        jprec = "bf16" if prec == "16bit" else prec
        with jax.default_matmul_precision(JAX_PRECISION[jprec]):
            step, (params, s, x, y) = jax_step(sizes, batch, opt, jprec)
            st = {"p": params, "s": s, "l": None}

            def call():
                st["p"], st["s"], st["l"] = step(st["p"], st["s"], x, y)

            def sync():
                if st["l"] is not None:
                    st["l"].block_until_ready()

            for _ in range(3):
                call()
            sync()
            host = host_call_us(call, sync, steps)

            def run():
                for _ in range(steps):
                    call()
                sync()
            row = {"framework": "jax", "model": model, "optimizer": opt, "precision": prec,
                   "activation": peers.ACTIVATION[0], "host_call_us": round(host, 2),
                   **summarize(gpu_events(run, steps), steps)}
        results.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "kernels"}), flush=True)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--framework", choices=("fuseflow", "jax"), required=True)
    ap.add_argument("--configs", default=DEFAULT_CONFIGS,
                    help="comma-separated model:optimizer:precision (fp32, tf32, 16bit; fuseflow "
                         "also fp64: params, batch and optimizer all in float64)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="", help="suffix of the JSON file name")
    ap.add_argument("--activation", choices=("relu", "gelu"), default="relu",
                    help="the models' hidden activation (peers.py's --activation)")
    args = ap.parse_args()
    peers.ACTIVATION[:] = [args.activation]
    configs = parse_configs(args.configs)
    fn = profile_fuseflow if args.framework == "fuseflow" else profile_jax
    result = {"benchmark": "profile_step", "framework": args.framework,
              **metadata("cupy", "nvmath", "jax", "torch"), "steps": args.steps,
              "configs": fn(configs, args.steps)}
    write_json(os.path.join(args.out, f"profile_{args.framework}{'_' + args.tag if args.tag else ''}.json"), result)


if __name__ == "__main__":
    main()
