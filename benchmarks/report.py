"""Markdown tables from the peers JSON files (fuseflow, JAX, torch, hand nvmath).

    python benchmarks/report.py benchmarks/results [FUSEFLOW_JSON_NAME] > table.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(folder, name):
    p = Path(folder) / (name if name.endswith(".json") else f"peers_{name}.json")
    return json.loads(p.read_text()) if p.exists() else None


def key(r):
    return r["model"], r["optimizer"], r["precision"]


def main(folder, fuseflow_file="fuseflow"):
    ff, jx, th, hand = (load(folder, n) for n in (fuseflow_file, "jax", "torch", "hand_nvmath"))
    jax_us = {key(r): r["jit_us"] for r in jx["steps"]} if jx else {}
    torch_us = {(key(r), r["mode"]): r["us"] for r in th["steps"]} if th else {}
    hand_us = {key(r): (r["eager_us"], r["graph_us"]) for r in hand["steps"]} if hand else {}
    print("| model, batch | opt | precision | fuseflow eager | fuseflow compiled | hand nvmath "
          "eager / graph | JAX jit | torch eager | torch.compile / reduce-overhead | "
          "compiled / JAX |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in ff["steps"]:
        k = key(r)
        jk = (k[0], k[1], "bf16") if k[2] == "fp16" else k
        j = jax_us.get(jk)
        h = hand_us.get(k)
        tc = [torch_us.get((jk, m)) for m in ("eager", "default", "reduce-overhead")]
        fmt = lambda v: f"{v:,.0f}" if v is not None else "-"  # noqa: E731
        print(f"| {k[0]}, {r['batch']} | {k[1]} | {k[2]}{' (JAX/torch: bf16)' if k[2] == 'fp16' else ''} "
              f"| {fmt(r['eager_us'])} | **{fmt(r['compiled_us'])}** "
              f"| {fmt(h[0]) + ' / ' + fmt(h[1]) if h else '-'} | {fmt(j)} | {fmt(tc[0])} "
              f"| {fmt(tc[1])} / {fmt(tc[2])} | {r['compiled_us'] / j:.2f}x |" if j else "| - |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results",
         sys.argv[2] if len(sys.argv) > 2 else "fuseflow")
