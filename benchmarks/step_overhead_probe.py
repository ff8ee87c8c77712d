"""The small launches around a compiled step's matmuls, each on and off, side by side:

- ``in_graph``: the batch copied into the graph's input buffers by the graph's first node,
  repointed before each launch (``_cuda_graph_inputs.IN_GRAPH``), or by one cudaMemcpyAsync
  per array before the launch (before: the profile of call 78 shows 4-5 us idle between the
  copies and the graph's first kernel);
- ``tail``: the input gradient's bias-gradient partials added by the last block of the
  DRELU kernel (``_cuda_epilogs.DRELU_TICKET``) or by a second launch;
- ``l2``: the donated params and optimizer state in one buffer marked persisting in L2
  (``FUSEFLOW_L2_PERSIST=1``, ``_cuda_l2``).

    python benchmarks/step_overhead_probe.py --out DIR [--rounds 3] [--data-dir MNIST]

The compiled step of each model and optimizer, for each variant, alternating over rounds:
the median step time over blocks of back-to-back calls, each call handed the other of two
batches (``peers.compiled_step_us``). With ``--data-dir``, also MNIST epochs of the medium
Adam step as the time-to-98 recipe runs them (``device_batches``: the epoch gathered on
the device once, each batch a slice), batch copies in or out of the graph: the median
epoch over rounds. JSON out.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402
from peers import MODELS, compiled_step_us, fuseflow_step  # noqa: E402

VARIANTS = {  # name: (batch copied by the graph, drelu tail in the kernel, L2 persistence)
    "memcpy": (False, False, False),
    "tail": (False, True, False),
    "in_graph": (True, False, False),
    "in_graph+tail": (True, True, False),
    "in_graph+tail+l2": (True, True, True),
}
EPOCH_VARIANTS = ("memcpy", "in_graph+tail", "in_graph+tail+l2")


def use(G, E, name):
    """Switch the settings of variant ``name`` on."""
    G.IN_GRAPH, E.DRELU_TICKET, l2 = VARIANTS[name]
    os.environ["FUSEFLOW_L2_PERSIST"] = "1" if l2 else "0"
    gc.collect()  # freed steps' persisting L2 lines back to normal (GraphCapture's finalizer)

CONFIGS = [("784-1024-1024-10", "sgd"), ("784-1024-1024-10", "adam"), ("784-30-10", "sgd"),
           ("784-30-10", "adam")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data-dir", help="MNIST's IDX files: also time training epochs")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, of {', '.join(VARIANTS)}")
    args = ap.parse_args()

    import cupy as cp

    import fuseflow as ff
    from fuseflow.backend import _cuda_epilogs as E
    from fuseflow.backend import _cuda_graph_inputs as G

    rows = []
    for r in range(args.rounds):
        for name in args.variants.split(","):
            use(G, E, name)
            for model, opt in CONFIGS:
                info = {}
                us, loss = compiled_step_us(ff, cp, model, opt, batches=2, info=info)
                row = {"round": r, "variant": name, "model": model, "optimizer": opt,
                       "us": round(us, 2), "loss": loss, **info}
                print(json.dumps(row), flush=True)
                rows.append(row)
    use(G, E, "in_graph+tail")
    summary = {}
    for model, opt in CONFIGS:
        key = f"{model} {opt}"
        summary[key] = {name: round(statistics.median(
            x["us"] for x in rows if x["variant"] == name and x["model"] == model
            and x["optimizer"] == opt), 2) for name in args.variants.split(",")}
        print(key, json.dumps(summary[key]), flush=True)
    epochs = epoch_rows(ff, cp, G, E, args) if args.data_dir else []
    write_json(Path(args.out) / "step_overhead_probe.json",
               {**metadata("cupy", "nvmath"), "benchmark": "step_overhead_probe",
                "variants": VARIANTS, "rows": rows, "median_us": summary, "epochs": epochs})


def epoch_rows(ff, cp, G, E, args):
    """Seconds per MNIST epoch (234 steps of 256) of the compiled medium Adam step in each
    of ``EPOCH_VARIANTS``, alternating over rounds."""
    x, y = (cp.asarray(a) for a in ff.data.mnist("train", data_dir=args.data_dir))
    rows = []
    for r in range(args.rounds):
        for name in EPOCH_VARIANTS:
            use(G, E, name)
            sizes, batch = MODELS["784-1024-1024-10"]
            _, params, state, step, _, _ = fuseflow_step(ff, cp, sizes, batch, "adam", "fp32")
            compiled = ff.compile(step)
            st = {"p": params, "s": state}
            times = []
            for epoch in range(3):  # the first one compiles
                cp.cuda.Device().synchronize()
                t0 = time.perf_counter()
                for xb, yb in ff.data.device_batches(x, y, 256, key=ff.random.key(epoch)):
                    st["p"], st["s"], _ = compiled(st["p"], st["s"], xb, yb)
                cp.cuda.Device().synchronize()
                times.append(time.perf_counter() - t0)
            row = {"round": r, "variant": name, "epoch_s": [round(t, 5) for t in times],
                   "in_graph_copy": compiled._last.inputs is not None,
                   "l2_hit_ratio": compiled._last.capture.persist_hit_ratio}
            print(json.dumps(row), flush=True)
            rows.append(row)
            compiled = st = None
            cp.get_default_memory_pool().free_all_blocks()
    use(G, E, "in_graph+tail")
    for name in EPOCH_VARIANTS:
        med = statistics.median(t for row in rows if row["variant"] == name
                                for t in row["epoch_s"][1:])
        print(f"epoch, {name}: {med * 1e3:.2f} ms", flush=True)
    return rows


if __name__ == "__main__":
    main()
