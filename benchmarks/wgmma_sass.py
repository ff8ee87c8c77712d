"""Static SASS instruction counts of the backend's 3xTF32 ``wgmma`` kernel, per operand
layout and split, without a GPU: the kernel is compiled for sm_90a with NVRTC and
disassembled with nvdisasm. Why: the kernel is instruction-bound in its convert pass
(Nsight Compute, call 193), so a split's count is a first estimate of its cost.

    pip download nvidia-cuda-nvrtc nvidia-cuda-nvdisasm --no-deps -d W   # CUDA 13 wheels
    python benchmarks/wgmma_sass.py --nvrtc .../libnvrtc.so.13 --nvdisasm .../nvdisasm \\
        --out DIR --tag T

NVRTC is loaded by ctypes because CuPy's binding (CUDA 12) writes cubins CUDA 13's
nvdisasm does not read. JSON out (``wgmma_sass_T.json``): per layout and split the total
and the count of each opcode.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _meta import metadata, write_json  # noqa: E402

from fuseflow.backend import _cuda_wgmma as W  # noqa: E402

OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]+)")


def cubin(lib, src: str) -> bytes:
    """``src`` compiled for sm_90a by the NVRTC library ``lib``."""
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"wgmma.cu", 0, None, None):
        raise RuntimeError("nvrtcCreateProgram failed")
    try:
        opts = (ctypes.c_char_p * 2)(b"-arch=sm_90a", b"--std=c++17")
        if lib.nvrtcCompileProgram(prog, 2, opts):
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(log.value.decode())
        size = ctypes.c_size_t()
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        out = ctypes.create_string_buffer(size.value)
        if lib.nvrtcGetCUBIN(prog, out):
            raise RuntimeError("nvrtcGetCUBIN failed")
        return out.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def opcodes(lib, nvdisasm: str, src: str) -> collections.Counter:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin(lib, src))
        f.flush()
        sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    return collections.Counter(OPCODE.findall(sass))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nvrtc", required=True, help="libnvrtc.so.13")
    ap.add_argument("--nvdisasm", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    lib = ctypes.CDLL(args.nvrtc)
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    rows = []
    for a_kmajor, b_kmajor in ((1, 0), (1, 1), (0, 0), (0, 1)):
        for split, chop in sorted(W.SPLITS.items()):
            ops = opcodes(lib, args.nvdisasm, W.source(a_kmajor, b_kmajor, chop))
            rows.append({"a_kmajor": a_kmajor, "b_kmajor": b_kmajor, "split": split,
                         "total": sum(ops.values()), "opcodes": dict(ops.most_common())})
            print(f"A k-major {a_kmajor} B k-major {b_kmajor} {split:15s} "
                  f"{rows[-1]['total']:5d}  FSETP {ops['FSETP']:3d}  SEL {ops['SEL']:3d}")
    name = f"wgmma_sass{'_' + args.tag if args.tag else ''}.json"
    write_json(Path(args.out) / name,
               {**metadata(), "benchmark": "wgmma_sass", "arch": "sm_90a", "tile": W.TILE,
                "nvrtc": f"{major.value}.{minor.value}", "rows": rows})


if __name__ == "__main__":
    main()
