"""CUDA-backend settings side by side in compiled training steps.

    python benchmarks/settings_ab.py --out DIR --name NAME \\
        --setting overlap_skinny_tc=0 --setting overlap_skinny_tc=1 \\
        [--config 784-4096-4096-10:adam:bf16 ...] [--rounds 3]

Each ``--setting`` is one arm: comma-separated ``attribute=value`` pairs set on the
process's CUDA backend (values parsed as Python literals where they parse: ``0``, ``1``,
``False``, ``262144``; anything else, such as ``auto``, stays a string). An attribute
``module.NAME`` is a constant of ``fuseflow.backend.module`` instead, read when a step is
compiled (``_cuda_skinny_tc.GRAD_WARPS=8``). For every ``--config`` (``model:optimizer:
precision`` as in ``peers.py``) each round times a fresh compiled step of ``peers.py`` under
every arm (two alternating batches; the median over 7 blocks of back-to-back calls), the
arms' order reversed every other round. JSON out (``settings_ab_NAME.json``): every row, and per config the arms' medians and
their ratios to the first arm.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402
import peers  # noqa: E402
from peers import MODELS, compiled_step_us  # noqa: E402


#: The backend's counters each row records (which paths the arm's compile and warm-up took).
COUNTERS = ("overlapped_wgrad", "fused_skinny_grads", "fused_tc_xent", "split_update",
            "split_update_overlapped", "fused_head", "own_epilog", "k_split", "wgmma",
            "fused_tc_head")


def parse_setting(text):
    """``"a=1,b=auto"`` -> ``{"a": 1, "b": "auto"}``."""
    out = {}
    for pair in text.split(","):
        name, _, value = pair.partition("=")
        if not name or not _:
            raise SystemExit(f"--setting {text!r}: expected attribute=value[,attribute=value]")
        try:
            out[name.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            out[name.strip()] = value.strip()
    return out


def resolve(backend, name):
    """``(object, attribute)`` that ``name`` sets: the backend's attribute, or for
    ``module.NAME`` the constant NAME of ``fuseflow.backend.module``."""
    module, _, attr = name.rpartition(".")
    if not module:
        return backend, name
    return importlib.import_module(f"fuseflow.backend.{module}"), attr


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", required=True, help="names the JSON file")
    ap.add_argument("--setting", action="append", required=True,
                    help="one arm: attribute=value[,attribute=value]")
    ap.add_argument("--config", action="append",
                    help="model:optimizer:precision (default: the large model, 16-bit, "
                         "Adam and SGD)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=0, help="calls per block (0: by model)")
    ap.add_argument("--activation", choices=("relu", "gelu"), default="relu",
                    help="the models' hidden activation (peers.py's --activation)")
    ap.add_argument("--loss-scaling", choices=peers.LOSS_SCALING_CHOICES, default="auto",
                    help="the 16-bit steps' (peers.py's --fuseflow-loss-scaling; auto: none "
                         "in bf16, dynamic in fp16); the split update is only taken with none")
    args = ap.parse_args()
    peers.FUSEFLOW_LOSS_SCALING[:] = [args.loss_scaling]
    peers.ACTIVATION[:] = [args.activation]
    arms = [parse_setting(s) for s in args.setting]
    configs = [tuple(c.split(":")) for c in (args.config or [
        "784-4096-4096-10:adam:bf16", "784-4096-4096-10:sgd:bf16"])]
    for model, _, _ in configs:
        if model not in MODELS:
            raise SystemExit(f"--config: unknown model {model!r}; one of {list(MODELS)}")

    import cupy as cp

    import fuseflow as ff

    be = ff.backend.get("cuda")
    targets = {k: resolve(be, k) for arm in arms for k in arm}
    for k, (obj, attr) in targets.items():
        if not hasattr(obj, attr):
            raise SystemExit(f"--setting: {k!r} is not an attribute of {obj!r}")
    defaults = {k: getattr(*targets[k]) for k in targets}
    rows = []
    for r in range(args.rounds):
        for model, opt, prec in configs:
            order = list(enumerate(arms))
            for i, arm in (order if r % 2 == 0 else order[::-1]):
                for k, v in {**defaults, **arm}.items():
                    setattr(*targets[k], v)
                be.tf32 = prec == "tf32"
                be.reset_stats()
                steps = args.steps or (100 if model.endswith("4096-10") else 200)
                us, loss = compiled_step_us(ff, cp, model, opt, prec, steps=steps, batches=2)
                stats = be.stats()
                row = {"round": r, "model": model, "optimizer": opt, "precision": prec,
                       "activation": args.activation, "arm": i, "setting": arm,
                       "us": round(us, 2), "loss": loss,
                       **{k: stats[k] for k in COUNTERS}}
                print(json.dumps(row), flush=True)
                rows.append(row)
    for k, v in defaults.items():
        setattr(*targets[k], v)
    be.tf32 = False
    summary = []
    for model, opt, prec in configs:
        med = [statistics.median(x["us"] for x in rows if (x["model"], x["optimizer"],
                                 x["precision"], x["arm"]) == (model, opt, prec, i))
               for i in range(len(arms))]
        summary.append({"model": model, "optimizer": opt, "precision": prec,
                        "activation": args.activation, "settings": arms,
                        "median_us": [round(m, 2) for m in med],
                        "ratio_to_first": [round(m / med[0], 4) for m in med]})
        print(json.dumps(summary[-1]), flush=True)
    write_json(Path(args.out) / f"settings_ab_{args.name}.json",
               {**metadata("cupy", "nvmath"), "benchmark": "settings_ab", "name": args.name,
                "loss_scaling": args.loss_scaling, "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
