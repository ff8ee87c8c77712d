"""Every cuBLASLt algorithm for every matmul of one training step, timed on the GPU.

    python benchmarks/matmul_sweep.py --out DIR [--models 784-1024-1024-10] [--limit 64]

Runs one eager step of fuseflow's MLP to record the matmuls the backend issues (stage,
epilog, operands), then for each: asks cuBLASLt's heuristic for up to ``--limit``
algorithms, times each (``fuseflow.backend._cuda_autotune``: CUDA-graph replays) with the
epilog and without it, and reports the heuristic's first choice against the fastest.
This is what tells whether a better algorithm exists for the small-batch shapes where
full-fp32 matmuls leave most of the GPU idle. JSON out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402
from peers import MODELS, fuseflow_step  # noqa: E402

def record_matmuls(ff, cp, model, prec):
    """(stage, epilog, a, b, inputs) of every matmul one eager step issues."""
    be = ff.backend.get("cuda")
    be.tf32 = prec == "tf32"
    be.fp32_wgmma = "off"  # else the 3xTF32 kernel takes fp32 products cuBLASLt never sees
    sizes, batch = MODELS[model]
    _, params, state, step, x, y = fuseflow_step(ff, cp, sizes, batch, "sgd", prec)
    seen = []
    original = be._matmul

    def spy(stage, epilog, a, b, inputs):
        seen.append((stage, epilog, a, b, dict(inputs)))  # kept alive: timed below
        return original(stage, epilog, a, b, inputs)

    be._matmul = spy
    try:
        step(params, state, x, y)
    finally:
        be._matmul = original
    cp.cuda.Device().synchronize()
    return be, seen


def describe(alg):
    out = {"id": alg.algorithm_id}
    for k in ("tile", "stages", "split_k", "reduction_scheme", "cta_swizzling", "custom_option"):
        try:
            v = getattr(alg, k)
            out[k] = v if isinstance(v, (int, str, bool)) else str(v)
        except Exception:  # noqa: BLE001 - not every attribute exists on every CTK
            pass
    try:
        out["workspace"] = int(alg.algorithm._data["workspace_size"])
        out["waves"] = float(alg.algorithm._data["waves_count"])
    except Exception:  # noqa: BLE001
        pass
    return out


def sweep_one(cp, be, stage, epilog, a, b, inputs, limit):
    from nvmath.linalg.advanced import Matmul, MatmulEpilog

    ct = be._compute_type(a.dtype)
    mm = Matmul(a, b, options={"compute_type": ct})
    algs = mm.plan(preferences={"limit": limit},
                   epilog=None if epilog is None else MatmulEpilog[epilog],
                   epilog_inputs=inputs or None)
    from fuseflow.backend._cuda_autotune import fastest

    _, timings = fastest(mm, algs)
    rows = [{"rank": i, **({"us": round(us, 3)} if us != float("inf") else {"error": "failed"}),
             **describe(alg)} for i, (alg, us) in enumerate(zip(algs, timings))]
    mm.free()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--models", default="784-30-10,784-1024-1024-10")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "tf32"))
    ap.add_argument("--limit", type=int, default=64)
    args = ap.parse_args()
    import cupy as cp

    import fuseflow as ff

    results = []
    for model in args.models.split(","):
        be, calls = record_matmuls(ff, cp, model, args.precision)
        for stage, epilog, a, b, inputs in calls:
            shape = {"a": list(a.shape), "a_strides": list(a.strides), "b": list(b.shape),
                     "b_strides": list(b.strides)}
            entry = {"model": model, "stage": stage, "epilog": epilog, **shape}
            for name, ep in (("fused", epilog), ("plain", None)):
                if name == "plain" and epilog is None:
                    continue
                rows = sweep_one(cp, be, stage, ep, a, b, inputs if ep else {}, args.limit)
                ok = [r for r in rows if "us" in r]
                entry[name] = {"n_algorithms": len(rows),
                               "heuristic_us": ok[0]["us"] if ok and ok[0]["rank"] == 0 else None,
                               "best": min(ok, key=lambda r: r["us"]) if ok else None,
                               "all": rows}
            results.append(entry)
            brief = {k: entry[k] for k in ("model", "stage", "epilog", "a", "b")}
            for name in ("fused", "plain"):
                if name in entry and entry[name]["best"]:
                    brief[name] = (entry[name]["heuristic_us"], entry[name]["best"]["us"],
                                   entry[name]["best"].get("split_k"), entry[name]["best"].get("tile"))
            print(json.dumps(brief), flush=True)
    write_json(os.path.join(args.out, f"matmul_sweep_{args.precision}.json"),
               {"benchmark": "matmul_sweep", **metadata("cupy", "nvmath"), "limit": args.limit,
                "matmuls": results})


if __name__ == "__main__":
    main()
