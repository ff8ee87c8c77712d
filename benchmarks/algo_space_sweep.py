"""cuBLASLt's configuration space, beyond the heuristic's picks, for the matmuls of one step.

    python benchmarks/algo_space_sweep.py --out DIR [--models 784-1024-1024-10]

``matmul_sweep.py`` times the algorithms cuBLASLt's heuristic returns; for the medium
model's full-fp32 matmuls these are all split-K kernels with a separate reduction kernel
(reduction scheme COMPUTE_TYPE). This script builds every configuration of each algorithm
the heuristic named -- tile, split-K count, reduction scheme (in place, compute type,
output type), custom option -- keeps those ``cublasLtMatmulAlgoCheck`` accepts, and times
them (CUDA-graph replays, ``fuseflow.backend._cuda_autotune``): a quick pass over all, then
the fastest again with more replays, each checked against the heuristic's result. JSON out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402
from matmul_sweep import describe, record_matmuls  # noqa: E402

SPLITS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)
SCHEMES = (1, 2, 4)  # INPLACE, COMPUTE_TYPE, OUTPUT_TYPE; NONE (0) goes with split-K 1


def configurations(mm, heuristic, max_custom):
    """Every accepted configuration of the algorithms in ``heuristic`` (nvmath Algorithms)."""
    from nvmath.bindings import cublasLt as lt
    from nvmath.linalg.advanced import Algorithm

    templates = {}
    for alg in heuristic:
        templates.setdefault(alg.algorithm_id, alg)
    out, seen, rejected = [], set(), 0
    for tmpl in templates.values():
        caps = tmpl.capabilities
        tiles = [t for t in (caps.tile_ids or []) if t != "undefined"] or [tmpl.tile]
        splits = SPLITS if caps.splitk_support else (1,)
        schemes = [s for s in SCHEMES if caps.reduction_scheme_mask & s]
        customs = range(min(int(caps.custom_option_max), max_custom) + 1)
        for tile in tiles:
            for sk in splits:
                for red in ([0] if sk == 1 else schemes):
                    for co in customs:
                        cand = Algorithm.from_numpy(tmpl.as_numpy())
                        try:
                            cand.tile = tile
                            cand.split_k = sk
                            cand.reduction_scheme = red
                            cand.custom_option = co
                            res = lt.MatmulHeuristicResult(1)
                            lt.matmul_algo_check(mm.handle, mm.mm_desc, mm.a_layout_ptr,
                                                 mm.b_layout_ptr, mm.c_layout_ptr,
                                                 mm.d_layout_ptr, cand.algorithm.ptr, res.ptr)
                        except Exception:  # noqa: BLE001 - not a valid configuration
                            rejected += 1
                            continue
                        data = cand.algorithm._data
                        data["workspace_size"] = res._data["workspace_size"]
                        data["waves_count"] = res._data["waves_count"]
                        key = (cand.algorithm_id, str(cand.tile), str(cand.stages), sk, red, co)
                        if key not in seen:
                            seen.add(key)
                            out.append(cand)
    return out, rejected


def result(mm, alg):
    r = mm.execute(algorithm=alg)
    return r[0] if isinstance(r, tuple) else r


def sweep(cp, be, epilog, a, b, inputs, args):
    from nvmath.linalg.advanced import Matmul, MatmulEpilog

    from fuseflow.backend._cuda_autotune import graph_time_us

    ct = be._compute_type(a.dtype)
    ep = None if epilog is None else MatmulEpilog[epilog]
    mm = Matmul(a, b, options={"compute_type": ct})
    heuristic = mm.plan(preferences={"limit": 64}, epilog=ep, epilog_inputs=inputs or None)
    t0 = time.perf_counter()
    cands, rejected = configurations(mm, heuristic, args.max_custom)
    check_s = time.perf_counter() - t0
    mm.free()
    mm = Matmul(a, b, options={"compute_type": ct})
    planned = mm.plan(algorithms=[heuristic[0], *cands], epilog=ep,
                      epilog_inputs=inputs or None)
    ref = cp.array(result(mm, planned[0]), copy=True)
    scale = float(cp.abs(ref).max()) or 1.0

    def timed(alg, reps, replays):
        try:
            return graph_time_us(lambda: mm.execute(algorithm=alg), reps, replays)
        except Exception:  # noqa: BLE001 - accepted by the check, refused at run time
            return float("inf")

    t0 = time.perf_counter()
    quick = [timed(alg, 3, 1) for alg in planned]
    order = sorted(range(len(planned)), key=quick.__getitem__)[: args.top]
    if 0 not in order:
        order.append(0)
    rows = []
    for i in order:
        us = timed(planned[i], 10, 5)
        try:
            err = float(cp.abs(result(mm, planned[i]) - ref).max()) / scale
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__}"
        rows.append({"heuristic_first": i == 0, "us": round(us, 3), "quick_us": round(quick[i], 3),
                     "max_rel_diff": err, **describe(planned[i])})
    sweep_s = time.perf_counter() - t0
    mm.free()
    rows.sort(key=lambda r: r["us"])
    first = next(r for r in rows if r["heuristic_first"])
    ok = [r for r in rows if isinstance(r["max_rel_diff"], float) and r["max_rel_diff"] < 1e-5]
    return {"n_heuristic": len(heuristic), "n_configurations": len(cands),
            "n_rejected": rejected, "n_failed_at_run": sum(q == float("inf") for q in quick),
            "check_s": round(check_s, 2), "time_s": round(sweep_s, 2),
            "heuristic_us": first["us"], "best": ok[0] if ok else None, "top": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--models", default="784-1024-1024-10")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "tf32"))
    ap.add_argument("--top", type=int, default=12, help="configurations timed again")
    ap.add_argument("--max-custom", type=int, default=3, help="highest custom option tried")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    import cupy as cp

    import fuseflow as ff

    results = []
    for model in args.models.split(","):
        be, calls = record_matmuls(ff, cp, model, args.precision)
        for stage, epilog, a, b, inputs in calls:
            entry = {"model": model, "stage": stage, "epilog": epilog, "a": list(a.shape),
                     "a_strides": list(a.strides), "b": list(b.shape),
                     "b_strides": list(b.strides)}
            for name, ep in (("fused", epilog), ("plain", None)):
                if name == "plain" and epilog is None:
                    continue
                try:
                    entry[name] = sweep(cp, be, ep, a, b, inputs if ep else {}, args)
                except Exception as e:  # noqa: BLE001 - report and go on to the next matmul
                    entry[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
                s = entry[name]
                best = s.get("best") or {}
                print(json.dumps({"stage": stage, "epilog": ep, "a": list(a.shape),
                                  "b": list(b.shape), "variant": name,
                                  "heuristic_us": s.get("heuristic_us"),
                                  "best_us": best.get("us"),
                                  "best": {k: best.get(k) for k in ("id", "tile", "split_k",
                                                                    "reduction_scheme",
                                                                    "custom_option")},
                                  "n": s.get("n_configurations"), "time_s": s.get("time_s"),
                                  "error": s.get("error")}), flush=True)
            results.append(entry)
    name = f"algo_space_sweep_{args.precision}{args.tag}.json"
    write_json(os.path.join(args.out, name),
               {"benchmark": "algo_space_sweep", **metadata("cupy", "nvmath"),
                "splits": SPLITS, "schemes": SCHEMES, "max_custom": args.max_custom,
                "matmuls": results})


if __name__ == "__main__":
    main()
