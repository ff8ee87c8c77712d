"""Compiled steps with the captured memsets kept as memset nodes or replayed as fill
kernels (``_cuda_graph_memsets.ENABLED``), side by side in one process:

    python benchmarks/memset_probe.py --out DIR [--rounds 4]

For each configuration and setting, alternating over rounds: a fresh compiled step, the
median step time over blocks of back-to-back calls on two alternating batches
(``peers.compiled_step_us``), and the number of memset nodes the rewrite replaced. JSON out.
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
from peers import compiled_step_us  # noqa: E402

CONFIGS = [("784-4096-4096-10", "adam", "fp16"), ("784-4096-4096-10", "sgd", "fp16"),
           ("784-1024-1024-10", "sgd", "fp32")]
SETTINGS = {"keep": False, "kernel": True}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()

    import cupy as cp

    import fuseflow as ff
    from fuseflow.backend import _cuda_graph_memsets as M

    rows = []
    for r in range(args.rounds):
        for model, opt, prec in CONFIGS:
            for name, enabled in (SETTINGS.items() if r % 2 == 0
                                  else reversed(SETTINGS.items())):
                M.ENABLED = enabled
                info, seen = {}, {}
                original = M.without_memsets

                def counting(graph, original=original, seen=seen):
                    out = original(graph)
                    seen["replaced"] = getattr(out, "replaced", 0)
                    return out
                M.without_memsets = counting
                try:
                    steps = 50 if model.startswith("784-4096") else 200
                    us, loss = compiled_step_us(ff, cp, model, opt, prec, steps=steps,
                                                batches=2, info=info)
                finally:
                    M.without_memsets = original
                row = {"round": r, "setting": name, "model": model, "optimizer": opt,
                       "precision": prec, "us": round(us, 2), "loss": loss,
                       "memsets_replaced": seen.get("replaced", 0)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    M.ENABLED = True
    summary = {}
    for model, opt, prec in CONFIGS:
        key = f"{model} {opt} {prec}"
        summary[key] = {name: round(statistics.median(
            x["us"] for x in rows if x["setting"] == name and x["model"] == model
            and x["optimizer"] == opt and x["precision"] == prec), 2) for name in SETTINGS}
        print(key, json.dumps(summary[key]), flush=True)
    write_json(Path(args.out) / "memset_probe.json",
               {**metadata("cupy", "nvmath"), "benchmark": "memset_probe", "rows": rows,
                "median_us": summary})


if __name__ == "__main__":
    main()
