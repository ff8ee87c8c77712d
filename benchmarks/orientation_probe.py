"""An input gradient's matmul in its two operand orientations, through the CUDA backend.

    python benchmarks/orientation_probe.py --out DIR [--rounds 3]

``dx = dy @ w`` (dy (B, out) and w (out, in), both row-major) can be handed to cuBLASLt as
``w.T @ dy.T`` (the backend's form: both operands column-major, D (in, B) column-major,
that is dx row-major; cuBLASLt's kernel names end in ``NNT``) or as ``dy @ w`` (both
row-major, D row-major: ``TT``). The kernels cuBLASLt's heuristic picks differ; in call
106's profile of the 16-bit step the backend's form took 333 us where the weight gradient
of the same size (``NTT``) took 300. Timed here per shape and dtype: the median over 7
blocks of the mean CUDA-event span of 20 back-to-back calls of ``CudaBackend._plain_dgrad``
under each ``dgrad_orientation`` (the backend's plan cache, no epilog, a row-major dx as the
step gets it), orientations alternating, both results checked equal to within the
dtype's rounding. JSON out (``orientation_probe.json``).
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

#: (name, batch, out, in): the large model's hidden input gradient, and the medium one's
SHAPES = [("784-4096-4096-10 layer 2", 8192, 4096, 4096),
          ("784-1024-1024-10 layer 2", 256, 1024, 1024)]
PRECISIONS = ("fp16", "fp32", "tf32")


def span_us(cp, fn, calls=20, blocks=7):
    for _ in range(3):
        fn()
    spans = []
    for _ in range(blocks):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        spans.append(cp.cuda.get_elapsed_time(start, end) * 1e3 / calls)
    return statistics.median(spans)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import cupy as cp

    import fuseflow as ff

    be = ff.backend.get("cuda")
    rng = cp.random.default_rng(0)
    default = be.dgrad_orientation

    def form(orientation):  # the backend's own plain input gradient in that orientation
        def dgrad(dy, w):
            be.dgrad_orientation = orientation
            return be._plain_dgrad(dy, w)
        return dgrad

    forms = {"w.T @ dy.T (NN)": form("nn"), "dy @ w (TT)": form("tt")}
    rows = []
    for r in range(args.rounds):
        for prec in PRECISIONS:
            be.tf32 = prec == "tf32"
            dtype = cp.float16 if prec == "fp16" else cp.float32
            for name, batch, fout, fin in SHAPES:
                dy = rng.standard_normal((batch, fout), dtype=cp.float32).astype(dtype)
                w = (rng.standard_normal((fout, fin), dtype=cp.float32) / fout ** 0.5) \
                    .astype(dtype)
                results = {}
                for form in (list(forms) if r % 2 == 0 else list(forms)[::-1]):
                    us = span_us(cp, lambda f=forms[form]: f(dy, w))
                    results[form] = forms[form](dy, w)
                    flops = 2 * batch * fout * fin
                    rows.append({"round": r, "precision": prec, "shape": name,
                                 "form": form, "us": round(us, 2),
                                 "tflops": round(flops / us / 1e6, 1)})
                    print(json.dumps(rows[-1]), flush=True)
                a, b = (results[f].astype(cp.float32) for f in forms)
                rows[-1]["max_abs_diff"] = float(cp.abs(a - b).max())
                rows[-1]["max_abs"] = float(cp.abs(a).max())
    be.tf32, be.dgrad_orientation = False, default
    summary = []
    for prec in PRECISIONS:
        for name, *_ in SHAPES:
            med = {f: statistics.median(x["us"] for x in rows if x["precision"] == prec
                                        and x["shape"] == name and x["form"] == f)
                   for f in forms}
            first, second = list(forms)
            summary.append({"precision": prec, "shape": name,
                            "median_us": {f: round(v, 2) for f, v in med.items()},
                            "tt_over_nn": round(med[second] / med[first], 4)})
            print(json.dumps(summary[-1]), flush=True)
    write_json(Path(args.out) / "orientation_probe.json",
               {**metadata("cupy", "nvmath"), "benchmark": "orientation_probe",
                "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
