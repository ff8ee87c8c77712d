"""Would float64 matmuls (Hopper's FP64 tensor cores) beat full-float32 ones at the medium
model's shapes?

    python benchmarks/fp64_probe.py --out DIR

On the H200 both peaks are about 67 TFLOP/s: float32 runs on the SIMT cores (cuBLAS's
64x64 SIMT kernels reach about 40% of that at 256 x 1024 x 1024), float64 on DMMA tensor
cores. A float64 product of float32 operands loses nothing, so a faster DGEMM (plus the
casts it needs) would be a full-precision route past the SIMT kernels. For each of
784-1024-1024-10's five large matmuls at batch 256: CuPy's matmul in float32 (TF32 off)
and in float64, and the float32 -> float64 casts of both operands, each timed like a
compiled step runs it (20 calls in one CUDA graph, median over replays). JSON out.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402
from skinny_sweep import graph_us  # noqa: E402

# (label, a shape, b shape): out = a @ b, as the layer computes it
SHAPES = [
    ("layer 1 forward", (256, 784), (784, 1024)),
    ("layer 2 forward", (256, 1024), (1024, 1024)),
    ("layer 2 input gradient", (256, 1024), (1024, 1024)),
    ("layer 2 weight gradient", (1024, 256), (256, 1024)),
    ("layer 1 weight gradient", (784, 256), (256, 1024)),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.environ.setdefault("CUPY_TF32", "0")
    import cupy as cp

    rng = cp.random.default_rng(0)
    rows = []
    for label, sa, sb in SHAPES:
        a32 = rng.standard_normal(sa, dtype=cp.float32)
        b32 = rng.standard_normal(sb, dtype=cp.float32)
        a64, b64 = a32.astype(cp.float64), b32.astype(cp.float64)
        ref = a64 @ b64
        out32 = a32 @ b32
        flops = 2.0 * sa[0] * sa[1] * sb[1]
        row = {"label": label, "m": sa[0], "k": sa[1], "n": sb[1],
               "fp32_us": graph_us(lambda: a32 @ b32),
               "fp64_us": graph_us(lambda: a64 @ b64),
               "cast_operands_us": graph_us(lambda: (a32.astype(cp.float64),
                                                     b32.astype(cp.float64))),
               "fp64_with_casts_us": graph_us(lambda: (a32.astype(cp.float64)
                                                       @ b32.astype(cp.float64)
                                                       ).astype(cp.float32)),
               "fp32_max_rel_err": float(cp.abs(out32 - ref).max() / cp.abs(ref).max())}
        row["fp32_tflops"] = flops / row["fp32_us"] / 1e6
        row["fp64_tflops"] = flops / row["fp64_us"] / 1e6
        rows.append(row)
        print(f"{label:26s} fp32 {row['fp32_us']:7.2f} us  fp64 {row['fp64_us']:7.2f} us  "
              f"fp64+casts {row['fp64_with_casts_us']:7.2f} us")
    total = {k: sum(r[k] for r in rows) for k in ("fp32_us", "fp64_us", "fp64_with_casts_us")}
    print("sum", {k: round(v, 2) for k, v in total.items()})
    write_json(os.path.join(args.out, "fp64_probe.json"),
               {"benchmark": "fp64_probe", **metadata("cupy"), "shapes": rows, "sum": total})


if __name__ == "__main__":
    main()
