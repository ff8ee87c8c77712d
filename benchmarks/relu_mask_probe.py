"""ReLU masks from cuBLASLt's epilog against a pass over the forward's output, 16-bit.

    python benchmarks/relu_mask_probe.py --out DIR [--rounds 3]

The CUDA backend's ``relu_mask`` (``FUSEFLOW_RELU_MASK``): "epilog" runs the hidden layers'
forwards as RELU_AUX_BIAS (cuBLASLt writes the mask), "output" as RELU_BIAS plus
``_cuda_epilogs.relu_mask`` (one read of y, bits where y > 0); "auto", the default, takes
"output" for float16 matmuls of at least 2^32 multiply-adds. Timed here:

- each hidden layer's float16 forward of 784-4096-4096-10 at batch 8192, alone (median of
  CUDA-event spans over 20 back-to-back calls, 7 blocks);
- the compiled 16-bit step of ``peers.py`` (float16 compute, dynamic loss scaling, the
  update's float16 copy), SGD and Adam, the median over 7 blocks of 100 calls, with its
  matmul TFLOP/s against a plain 8192^3 float16 CuPy matmul timed in the same process.

Settings alternate within each round. JSON out (``relu_mask_probe.json``).
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
from peers import MODELS, compiled_step_us, matmul_flops, plain_matmul_rates  # noqa: E402

MODEL = "784-4096-4096-10"
MODES = ("epilog", "output")


def forward_us(cp, be, x, w, b, calls=20, blocks=7):
    """Median over ``blocks`` of the mean CUDA-event span of ``calls`` RELU_AUX_BIAS
    forwards (whatever the backend's ``relu_mask`` makes of them)."""
    for _ in range(3):
        be.linear(x, w, b, "RELU_AUX_BIAS")
    spans = []
    for _ in range(blocks):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(calls):
            be.linear(x, w, b, "RELU_AUX_BIAS")
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
    sizes, batch = MODELS[MODEL]
    rng = cp.random.default_rng(0)
    layers = {f"layer{i + 1} {k}->{n}": (
        rng.random((batch, k), dtype=cp.float32).astype(cp.float16),
        (rng.standard_normal((n, k), dtype=cp.float32) * (2 / k) ** 0.5).astype(cp.float16),
        (rng.standard_normal(n, dtype=cp.float32) * 0.1).astype(cp.float16))
        for i, (k, n) in enumerate(zip(sizes[:-2], sizes[1:-1]))}
    flops = matmul_flops(sizes, batch)
    rates = plain_matmul_rates(cp, "before")
    rows = []
    for r in range(args.rounds):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            be.relu_mask = mode
            for name, (x, w, b) in layers.items():
                be.reset_stats()
                us = forward_us(cp, be, x, w, b)
                rows.append({"round": r, "mode": mode, "what": name, "us": round(us, 2),
                             "mask_passes": be.stats()["relu_mask_pass"]})
                print(json.dumps(rows[-1]), flush=True)
            for opt in ("adam", "sgd"):
                be.reset_stats()
                us, loss = compiled_step_us(ff, cp, MODEL, opt, "fp16", steps=100)
                rows.append({"round": r, "mode": mode, "what": f"step fp16 {opt}",
                             "us": round(us, 2), "tflops": round(flops / us / 1e6, 1),
                             "loss": loss, "mask_passes": be.stats()["relu_mask_pass"]})
                print(json.dumps(rows[-1]), flush=True)
    be.relu_mask = "auto"
    rates.update(plain_matmul_rates(cp, "after"))
    ref = max(rates.values())
    summary = []
    for what in dict.fromkeys(x["what"] for x in rows):
        med = {m: statistics.median(x["us"] for x in rows if x["what"] == what
                                    and x["mode"] == m) for m in MODES}
        row = {"what": what, "median_us": {m: round(v, 2) for m, v in med.items()},
               "output_over_epilog": round(med["output"] / med["epilog"], 4)}
        if what.startswith("step"):
            row["tflops"] = {m: round(flops / v / 1e6, 1) for m, v in med.items()}
            row["of_cupy_fp16_matmul"] = {m: round(flops / v / 1e6 / ref, 4)
                                          for m, v in med.items()}
        summary.append(row)
        print(json.dumps(row), flush=True)
    write_json(Path(args.out) / "relu_mask_probe.json",
               {**metadata("cupy", "nvmath"), "benchmark": "relu_mask_probe", "model": MODEL,
                "batch": batch, "step_matmul_flops": flops, "cupy_fp16_matmul_tflops": rates,
                "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
