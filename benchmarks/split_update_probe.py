"""The optimizer update split at the side stream's join, on and off, in compiled steps.

    python benchmarks/split_update_probe.py --out DIR [--rounds 4]

With ``split_update`` "auto" (the CUDA backend's default, ``FUSEFLOW_SPLIT_UPDATE``), the fused
update of the leaves whose weight gradients ran on the side stream starts there as soon as
they are ready, beside the main stream's last weight gradient (``_cuda_overlap.SplitPoint``),
where they hold at least 2^18 elements; against 0 (one launch after the join); under the
overlap orders "after" (default) and "early" (each weight gradient forked before its layer's
input gradient, the lowest layer's on the main stream).
Each row: a fresh compiled step of ``peers.py``'s (full float32, two alternating batches),
the median over 7 blocks of 200 back-to-back calls; settings alternate within each round.
JSON out (``split_update_probe.json``) with the medians per setting and their ratio.
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

CONFIGS = [("784-1024-1024-10", "adam"), ("784-1024-1024-10", "sgd"),
           ("784-30-10", "adam"), ("784-30-10", "sgd")]
#: (overlap order, split_update, side streams): the one-launch update after the join, the
#: split, the order that forks each weight gradient before its layer's input gradient, and
#: two side streams taken in turn
SETTINGS = [("after", False, 1), ("after", "auto", 1), ("early", "auto", 1),
            ("early", "auto", 2), ("after", "auto", 2)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()

    import cupy as cp

    import fuseflow as ff

    be = ff.backend.get("cuda")
    rows = []
    for r in range(args.rounds):
        for model, opt in CONFIGS:
            for order, split, streams in (SETTINGS if r % 2 == 0 else SETTINGS[::-1]):
                be.overlap_order, be.split_update, be.overlap_streams = order, split, streams
                be.reset_stats()
                us, loss = compiled_step_us(ff, cp, model, opt, batches=2)
                row = {"round": r, "model": model, "optimizer": opt, "order": order,
                       "split_update": split, "side_streams": streams,
                       "splits": be.stats()["split_update"],
                       "us": round(us, 2), "loss": loss}
                print(json.dumps(row), flush=True)
                rows.append(row)
    summary = []
    for model, opt in CONFIGS:
        med = {f"{o}/{sp}/{n}": round(statistics.median(
            x["us"] for x in rows if x["model"] == model and x["optimizer"] == opt
            and x["order"] == o and x["split_update"] == sp and x["side_streams"] == n), 2)
            for o, sp, n in SETTINGS}
        summary.append({"model": model, "optimizer": opt, "median_us": med})
        print(json.dumps(summary[-1]), flush=True)
    write_json(Path(args.out) / "split_update_probe.json",
               {**metadata("cupy", "nvmath"), "benchmark": "split_update_probe",
                "precision": "fp32 (no TF32)", "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
