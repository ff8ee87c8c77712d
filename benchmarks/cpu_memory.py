"""Peak memory of `fuseflow train` on the CPU, in float32 copies of the params.

Each optimizer trains one epoch of scikit-learn's digits at two hidden widths, each run in a
fresh process that reports its own peak resident memory (``ru_maxrss``); the slope between
the two widths, over the float32 bytes of the params they add, is the number of copies of
the params alive at the peak (the constant part, Python and its imports, drops out). The
command line's memory check (``fuseflow.cli._COPIES``) rests on these numbers.

    python benchmarks/cpu_memory.py --out benchmarks/results/cpu_memory.json
    python benchmarks/cpu_memory.py --src /path/to/other/checkout   # the same for another tree
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _meta import metadata, write_json

CHILD = """
import resource, sys
import fuseflow
from fuseflow.cli import main
code = main(sys.argv[1:])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, fuseflow.__file__)
sys.exit(code)
"""


def params_of(width: int, inputs: int = 64, classes: int = 10) -> int:
    widths = (inputs, width, width, classes)
    return sum((a + 1) * b for a, b in zip(widths, widths[1:]))


def peak_kib(optimizer: str, width: int, src: str | None, precision: str,
             loss_scaling: str = "dynamic") -> tuple[int, str]:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory() as out:
        run = subprocess.run(
            [sys.executable, "-c", CHILD, "train", "--dataset", "digits", "--hidden",
             f"{width},{width}", "--epochs", "1", "--optimizer", optimizer, "--out", out,
             "--precision", precision, "--no-progress",
             *(["--loss-scaling", loss_scaling] if loss_scaling != "dynamic" else [])], env=env, cwd=out, capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"fuseflow train at --hidden {width},{width} with {optimizer} failed "
                 f"({run.returncode}):\n{run.stderr[-2000:]}")
    kib, module = run.stdout.strip().splitlines()[-1].split(" ", 1)
    return int(kib), module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--optimizers", default="sgd,momentum,adam,adamw")
    ap.add_argument("--widths", default="6000,9000", help="two hidden widths")
    ap.add_argument("--src", help="a checkout whose fuseflow is measured instead")
    ap.add_argument("--precision", default="float32", choices=("float32", "float16", "bfloat16"))
    ap.add_argument("--loss-scaling", default="dynamic", choices=("dynamic", "none"),
                    help="none: bfloat16 with compute_copy (fuseflow train --loss-scaling none)")
    ap.add_argument("--out", default="benchmarks/results/cpu_memory.json")
    args = ap.parse_args()
    small, large = (int(w) for w in args.widths.split(","))
    added = (params_of(large) - params_of(small)) * 4
    rows = []
    for opt in args.optimizers.split(","):
        (a, module), (b, _) = (peak_kib(opt, w, args.src, args.precision, args.loss_scaling)
                                for w in (small, large))
        copies = (b - a) * 1024 / added
        rows.append({"optimizer": opt, "peak_kib": {str(small): a, str(large): b},
                     "copies": round(copies, 2)})
        print(f"{opt:9s} peak {a / 2**20:.2f} / {b / 2**20:.2f} GiB at {small} / {large}: "
              f"{copies:.2f} float32 copies of the params ({module})", flush=True)
    write_json(args.out, {"meta": metadata("safetensors"), "src": args.src,
                          "precision": args.precision, "loss_scaling": args.loss_scaling,
                          "widths": [small, large], "rows": rows})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
