"""How accurate is 3xTF32 (``_cuda_gemm``'s ``mma="tf32x3"``) against full float32?

    python benchmarks/tf32x3_probe.py --out DIR

For the medium model's five matmuls (784-1024-1024-10 at batch 256: operands shaped and
scaled as in ``gemm_sweep.py``) and a 1024^3 product of standard normals, the product by
every path against the float64 product of the same float32 operands:

- ``cublaslt_fp32``: the backend's full-float32 path (cuBLASLt's SIMT kernels);
- ``own_simt``, ``own_tf32x3``: fuseflow's own kernel with float32 FMAs and with 3xTF32
  (call 129 also ran a form that summed every k-tile in the tensor cores' accumulators,
  named ``own_tf32x3`` there; the form kept was ``own_tf32x3p``);
- ``cublaslt_tf32``: cuBLASLt with TF32 (one TF32 rounding of each operand).

Errors: the norm-relative error ``|C - R| / |R|``, and the componentwise error
``|C - R| / (|A| |B|)`` (the scale of the standard float32 bound, ``k u |A| |B|``), its
median and maximum. JSON out (``tf32x3_probe.json``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402
from gemm_sweep import LAYERS, cublaslt_fp32  # noqa: E402


def errors(got, ref, scale):
    d = np.abs(np.asarray(got, dtype=np.float64) - ref)
    comp = d / np.maximum(scale, 1e-300)
    return {"norm_rel": float(np.linalg.norm(d) / np.linalg.norm(ref)),
            "comp_median": float(np.median(comp)), "comp_max": float(comp.max())}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import cupy as cp

    from fuseflow.backend import _cuda_gemm as G
    from fuseflow.backend.cuda_backend import CudaBackend

    fp32 = cublaslt_fp32()
    tf32 = CudaBackend(tf32=True, autotune=False)
    rng = np.random.default_rng(0)
    cases = []
    for label, op, batch, fin, fout in LAYERS[:5]:
        if op == "forward":   # y = x @ w.T, x after a ReLU
            a = np.maximum(rng.standard_normal((batch, fin)), 0).astype(np.float32)
            b = (rng.standard_normal((fin, fout)) / np.sqrt(fin)).astype(np.float32)
        elif op == "dgrad":   # dx = dy @ w
            a = rng.standard_normal((batch, fin)).astype(np.float32)
            b = (rng.standard_normal((fin, fout)) / np.sqrt(fin)).astype(np.float32)
        else:                 # dw = dy.T @ x
            a = rng.standard_normal((fout, batch)).astype(np.float32)
            b = np.maximum(rng.standard_normal((batch, fin)), 0).astype(np.float32)
        cases.append((label, op, a, b))
    cases.append(("1024^3 standard normals", "forward",
                  rng.standard_normal((1024, 1024)).astype(np.float32),
                  rng.standard_normal((1024, 1024)).astype(np.float32)))
    rows = []
    for label, op, a, b in cases:
        ref = a.astype(np.float64) @ b.astype(np.float64)
        scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
        A, B = cp.asarray(a), cp.asarray(b)
        paths = {}
        for name, be in (("cublaslt_fp32", fp32), ("cublaslt_tf32", tf32)):
            if op == "forward":
                paths[name] = be.linear(A, cp.ascontiguousarray(B.T), None, "DEFAULT")[0]
            elif op == "dgrad":
                paths[name] = be.linear_dgrad(A, B, "DEFAULT", None)[0]
            else:
                paths[name] = be.linear_wgrad(cp.ascontiguousarray(A.T), B, "DEFAULT")[0]
        for mma in ("simt", "tf32x3"):
            if op == "forward":
                paths[f"own_{mma}"] = G.forward(A, cp.ascontiguousarray(B.T), None, relu=False,
                                                aux_rows=None, mma=mma)[0]
            elif op == "dgrad":
                paths[f"own_{mma}"] = G.dgrad(A, B, None, 0, bgrad=False, mma=mma)[0]
            else:
                paths[f"own_{mma}"] = G.wgrad(cp.ascontiguousarray(A.T), B, mma=mma)
        row = {"label": label, "op": op, "m": a.shape[0], "k": a.shape[1], "n": b.shape[1],
               "errors": {k: errors(cp.asnumpy(v), ref, scale) for k, v in paths.items()}}
        rows.append(row)
        print(label, {k: f"{v['norm_rel']:.2e}/{v['comp_max']:.2e}"
                      for k, v in row["errors"].items()}, flush=True)
    write_json(os.path.join(args.out, "tf32x3_probe.json"),
               {"benchmark": "tf32x3_probe", **metadata("cupy", "nvmath"), "rows": rows})


if __name__ == "__main__":
    main()
