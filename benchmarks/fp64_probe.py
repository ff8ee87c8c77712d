"""Would float64 matmuls (Hopper's FP64 tensor cores) beat full-float32 ones at the medium
model's shapes?

    python benchmarks/fp64_probe.py --out DIR

On the H200 both peaks are about 67 TFLOP/s: float32 runs on the SIMT cores (cuBLAS's
64x64 SIMT kernels reach about 40% of that at 256 x 1024 x 1024), float64 on DMMA tensor
cores. A float64 product of float32 operands loses nothing, so a faster DGEMM (plus the
casts it needs) would be a full-precision route past the SIMT kernels. For each of
784-1024-1024-10's five large matmuls at batch 256: the backend's plain cuBLASLt matmul in
float32 (COMPUTE_32F, no TF32) and in float64 (COMPUTE_64F), and the float32 -> float64
casts of its operands, each timed like a compiled step runs it (20 calls in one CUDA graph,
median over replays). JSON out.

The backend ops through such a route (operands cast to float64 in one launch, the float64
matmul, fuseflow's epilog rounding to float32) were measured with commit 67d5ef7's
``--route`` (``results/session14_fp64_probe_route.json``): the casts and the epilog pass
cost more than the faster matmul gains at batch 256, so the route was not kept.
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
from gemm_sweep import LAYERS as SWEEP_LAYERS  # noqa: E402
from gemm_sweep import cublaslt_fp32  # noqa: E402
from skinny_sweep import graph_us  # noqa: E402

#: the medium model's five matmuls, (label, op, batch, inputs, outputs), timed plain
#: (DEFAULT epilog): the sweep's labels without the epilog it names
LAYERS = [(label.split(" (")[0], *rest) for label, *rest in SWEEP_LAYERS[:5]]


def layer_op(be, op, x, w, dy):
    """The plain (DEFAULT epilog) matmul of ``op`` through the backend's planned cuBLASLt
    call, which a CUDA graph can capture (CuPy's cuBLAS calls cannot be)."""
    if op == "forward":
        return lambda: be.linear(x, w)
    if op == "dgrad":
        return lambda: be.linear_dgrad(dy, w)
    return lambda: be.linear_wgrad(dy, x)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", default="fp64_probe", help="JSON file name (without .json)")
    args = ap.parse_args()
    import cupy as cp

    be = cublaslt_fp32()
    rng = cp.random.default_rng(0)
    rows = []
    for label, op, batch, fin, fout in LAYERS:
        x32 = rng.standard_normal((batch, fin), dtype=cp.float32)
        w32 = rng.standard_normal((fout, fin), dtype=cp.float32)
        dy32 = rng.standard_normal((batch, fout), dtype=cp.float32)
        x64, w64, dy64 = x32.astype(cp.float64), w32.astype(cp.float64), dy32.astype(cp.float64)
        out32 = layer_op(be, op, x32, w32, dy32)()[0]
        ref = layer_op(be, op, x64, w64, dy64)()[0]
        operands = {"forward": (x32, w32), "dgrad": (dy32, w32), "wgrad": (dy32, x32)}[op]
        flops = 2.0 * batch * fin * fout
        row = {"label": label, "op": op, "batch": batch, "in": fin, "out": fout,
               "fp32_us": graph_us(layer_op(be, op, x32, w32, dy32)),
               "fp64_us": graph_us(layer_op(be, op, x64, w64, dy64)),
               "cast_operands_us": graph_us(lambda: [a.astype(cp.float64) for a in operands]),
               "fp32_max_rel_err": float(cp.abs(out32 - ref).max() / cp.abs(ref).max())}
        row["fp32_tflops"] = flops / row["fp32_us"] / 1e6
        row["fp64_tflops"] = flops / row["fp64_us"] / 1e6
        rows.append(row)
        print(f"{label:26s} fp32 {row['fp32_us']:7.2f} us  fp64 {row['fp64_us']:7.2f} us  "
              f"operand casts {row['cast_operands_us']:6.2f} us")
    total = {k: sum(r[k] for r in rows) for k in ("fp32_us", "fp64_us", "cast_operands_us")}
    print("sum", {k: round(v, 2) for k, v in total.items()})
    write_json(os.path.join(args.out, args.name + ".json"),
               {"benchmark": "fp64_probe", **metadata("cupy", "nvmath"),
                "layers": rows, "sum": total})


if __name__ == "__main__":
    main()
