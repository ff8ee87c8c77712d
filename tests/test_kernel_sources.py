"""Every CUDA kernel source fuseflow generates compiles with NVRTC, without a GPU.

The generated kernels (skinny matmuls, multi-tensor updates, casts, the fused loss) are
specialized per dtype, tensor count and flags; a name clash or a typo in one variant only
shows when that variant is first launched. This compiles all the variants the code can
produce, for compute capability 9.0. It needs NVRTC (pip ``nvidia-cuda-nvrtc``) and the CUDA
headers (``CUDA_HOME`` or ``/usr/local/cuda*/include``); without them it is skipped.
"""

from __future__ import annotations

import glob
import itertools
import os

import numpy as np
import pytest

from fuseflow._dtypes import bfloat16

cupy = pytest.importorskip("cupy")


def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
        return nvrtc
    except Exception:  # noqa: BLE001 - no NVRTC library: nothing to compile with
        return None


def _include_dir():
    roots = [os.environ.get("CUDA_HOME", ""), *sorted(glob.glob("/usr/local/cuda*"))]
    for root in roots:
        if root and os.path.exists(os.path.join(root, "include", "cuda_fp16.h")):
            return os.path.join(root, "include")
    return None


NVRTC, INCLUDE = _nvrtc(), _include_dir()
# Marked gpu although it needs no GPU: the GPU runs (``pytest -m gpu``) are where CuPy and
# NVRTC are installed, so that is where it runs; elsewhere it is skipped.
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(NVRTC is None or INCLUDE is None,
                                 reason="needs NVRTC and the CUDA headers")]


class _Recorder:
    """Stands in for cupy.RawKernel / RawModule: records the source instead of compiling."""

    sources: list = []

    def __init__(self, code=None, name="module", **_):
        _Recorder.sources.append((name, code))

    def get_function(self, name):
        return name


def _generated_sources(monkeypatch):
    from fuseflow.backend import _cuda_epilogs as E
    from fuseflow.backend import _cuda_fused as F
    from fuseflow.backend import _cuda_gemm as G
    from fuseflow.backend import _cuda_graph_inputs as GI
    from fuseflow.backend import _cuda_head as H
    from fuseflow.backend import _cuda_random as R
    from fuseflow.backend import _cuda_skinny as S
    from fuseflow.backend import _cuda_skinny_tc as TC
    from fuseflow.backend import _cuda_tc_head as HD

    _Recorder.sources = []
    for mod in (E, F, G, GI, H, R, S, TC, HD):
        monkeypatch.setattr(mod.cupy, "RawKernel", _Recorder)
        monkeypatch.setattr(mod.cupy, "RawModule", _Recorder)
    caches = (S._kernel, TC._kernel, E._kernel, G._kernel, H._kernel, H._sum_kernel,
              F._xent_kernel, F._multi_tensor_kernel, F._cast_kernel, F._finite_kernel,
              F._next_loss_scale_kernel, GI._copy_kernel, R._kernel, TC._xent_kernel,
              HD._kernel)
    for cache in caches:
        cache.cache_clear()
    halves = ("__half", "__nv_bfloat16")
    for dt in (np.dtype(np.float16), bfloat16, np.dtype(np.float32), np.dtype(np.float64)):
        for n in (1, 10, 32):
            for hb, ha, r in itertools.product((False, True), repeat=3):
                for spb in (1, 3, 8):
                    S._kernel("skinny_forward", dt, n, HAS_BIAS=hb, HAS_AUX=ha, RELU=r,
                              SPB=spb, GELU=0)
                    if r:  # the GELU form (RELU off)
                        S._kernel("skinny_forward", dt, n, HAS_BIAS=hb, HAS_AUX=ha, RELU=0,
                                  SPB=spb, GELU=1)
            for v in (1, 2, 4, 8)[:{2: 4, 4: 3, 8: 2}[dt.itemsize]]:
                for d, b, st in itertools.product((False, True), repeat=3):
                    S._kernel("skinny_dgrad", dt, n, DRELU=d, BGRAD=b, V=v, STAGE_DY=st)
                for b, st in itertools.product((False, True), repeat=2):
                    most = S.outputs_per_round(n, v, dt, 48 * 1024)  # 48 KB of shared
                    for r in sorted({1, min(7, most), most, S.outputs_per_round(n, v, dt)}):
                        S._kernel("skinny_wgrad", dt, n, BGRADB=b, V=v, R=r, STAGE_DY=st)
        S._kernel("sum_chunks", dt, 1)
        # the fused output layer: (has_bias, dgrad, mask, bgrad) variants
        for n, (hb, dg, mask, bg) in itertools.product(
                (1, 10, H.MAX_CLASSES), ((1, 0, None, 0), (0, 1, None, 0), (1, 1, "relu", 0),
                                         (1, 1, "relu", 1), (0, 1, None, 1), (1, 1, "gelu", 1),
                                         (0, 1, "gelu", 0))):
            H._kernel(dt, np.dtype(np.int64 if hb else np.uint8), n, 1 + dg, hb, dg, mask, bg)
        H._sum_kernel(dt)
        splits = (0,) if dt.itemsize == 2 else (0, 2, 7)   # the own K split's partials
        for hb, ha, r, sp in itertools.product((False, True), (False, True), (False, True),
                                               splits):
            E._kernel("bias_relu", dt, HAS_BIAS=hb, HAS_AUX=ha, RELU=r, SPLITS=sp)
        for b, u, sp, t in itertools.product((False, True), (1, E.DRELU_UNROLL), splits,
                                             (False, True)):
            E._kernel("drelu", dt, BGRAD=b, UNROLL=u, SPLITS=sp, TICKET=b and t)
            E._kernel("drelu", dt, BGRAD=b, UNROLL=u, SPLITS=sp, TICKET=b and t, GELU=True)
        for hb, ha, sp in itertools.product((False, True), (False, True), splits):
            E._kernel("bias_gelu", dt, HAS_BIAS=hb, HAS_AUX=ha, SPLITS=sp)
        for labels in (np.int64, np.int32, np.uint8):
            for classes in (0, 1, 10, 32):
                F._xent_kernel(dt, np.dtype(labels), classes)
                # mixed precision's scaled 16-bit / float32 gradient
                for grad_dtype in {2: (np.float32, dt), 4: (np.float16, bfloat16)}.get(
                        dt.itemsize, ()):
                    F._xent_kernel(dt, np.dtype(labels), classes, np.dtype(grad_dtype))
        ct, wt = F._CTYPES[dt], ("double" if dt == np.float64 else "float")
        for kind, aligned, count in itertools.product(("sgd", "momentum", "adam"),
                                                      (True, False), (1, 6, 14)):
            sizes = tuple((7, 12, 1003, 4, 9)[i % 5] for i in range(count))
            decays = tuple(i % 2 == 0 for i in range(count))
            F._multi_tensor_kernel(kind, ct, wt, sizes, decays, kind == "momentum", aligned)
            if dt == np.float32:  # mixed precision: scaled 16-bit grads of float32 params
                for width, half in itertools.product((4, 8), halves):
                    F._multi_tensor_kernel(kind, ct, wt, sizes, decays, kind == "momentum",
                                           aligned, half, True, width)
                    # ... writing the 16-bit compute copy of the new params as well
                    F._multi_tensor_kernel(kind, ct, wt, sizes, decays, kind == "momentum",
                                           aligned, half, True, width, half)
        for dst in (np.dtype(np.float16), bfloat16, np.dtype(np.float32), np.dtype(np.float64)):
            for scaled in (False, True):
                F._cast_kernel(ct, F._CTYPES[dst], tuple(range(3, 17)), scaled, True,
                               F.vector_width(dt, dst))
        for scaled in (False, True):
            F._finite_kernel(ct, tuple(range(3, 17)), True, scaled, F.vector_width(dt))
    F._next_loss_scale_kernel()
    GI._copy_kernel()  # a compiled step's batch and donated-result copies
    R._kernel("unsigned int", 0)  # ff.random.bits, Dropout's factors and forward per dtype
    for ct, mode in itertools.product((*halves, "float", "double"), (1, 2)):
        R._kernel(ct, mode)
    # tensor-core skinny kernels (the two 16-bit formats)
    for n, dt in itertools.product((1, 10, 16), (np.dtype(np.float16), bfloat16)):
        u = TC.GRAD_UNROLL
        for hb in (False, True):
            TC._kernel("tc_forward", n, u, dt, HAS_BIAS=hb, WARPS=TC.FORWARD_WARPS)
            for labels in (np.int64, np.int32, np.uint8):  # the forward with the loss
                TC._xent_kernel(n, hb, np.dtype(labels), dt)
        for b, rows in itertools.product((False, True), (16, 48, TC.MAX_ROWS_PER_CHUNK)):
            TC._kernel("tc_wgrad", n, u, dt, BGRADB=b, WARPS=TC.GRAD_WARPS, RPC=rows)
            for d in (False, True):
                TC._kernel("tc_dgrad", n, u, dt, DRELU=d, BGRAD=b, WARPS=TC.GRAD_WARPS,
                           RPC=rows)
        for bw, bx, d, rows in itertools.product((False, True), (False, True), (False, True),
                                                 (16, 48, TC.MAX_ROWS_PER_CHUNK)):
            TC._kernel("tc_grads", n, u, dt, BGRADB=bw, DRELU=d, BGRAD=bx,
                       WARPS=TC.GRAD_WARPS, RPC=rows)
    # the one-pass output layer (a cluster of 1, 2 or 8 blocks; bias, both bias
    # gradients, mask; the split barrier, the warp roles)
    for n, dt, cl in itertools.product((1, 10, 16), (np.dtype(np.float16), bfloat16),
                                       (1, 2, 8)):
        for hb, d, bx in itertools.product((False, True), repeat=3):
            HD._kernel(n, cl, hb, hb, d, bx, np.dtype(np.int64), dt)
        HD._kernel(n, cl, True, True, True, True, np.dtype(np.uint8), dt)
        HD._kernel(n, cl, True, True, True, True, np.dtype(np.int64), dt, split=True)
        for hb, d in itertools.product((False, True), repeat=2):  # the warp roles
            HD._kernel(n, cl, hb, hb, d, hb, np.dtype(np.int64), dt, roles=True)
    # the launch shapes skinny_sweep.py times (warps per block, rows' steps unrolled)
    for warps, unroll in itertools.product((4, 8), (1, 2, 4)):
        TC._kernel("tc_grads", 10, unroll, BGRADB=True, DRELU=True, BGRAD=True, WARPS=warps,
                   RPC=TC.MAX_ROWS_PER_CHUNK)
        TC._kernel("tc_wgrad", 10, unroll, BGRADB=True, WARPS=warps,
                   RPC=TC.MAX_ROWS_PER_CHUNK)
        TC._kernel("tc_dgrad", 10, unroll, DRELU=True, BGRAD=True, WARPS=warps,
                   RPC=TC.MAX_ROWS_PER_CHUNK)
    for (ak, bk), warps, split in itertools.product(((1, 1), (1, 0), (0, 0)),
                                                    ((2, 2), (4, 1)), (0, 1)):
        for flags in ({}, {"HAS_BIAS": 1}, {"HAS_BIAS": 1, "RELU": 1, "AUX_OUT": 1},
                      {"RELU": 1, "AUX_OUT": 1}, {"DRELU": 1}, {"DRELU": 1, "BGRAD": 1},
                      {"BGRAD": 1}):
            G._kernel(ak, bk, *warps, G.BK, SPLIT=split, **flags)
    G._kernel(1, 1, 2, 2, 8, SPLIT=1, HAS_BIAS=1, RELU=1, AUX_OUT=1)
    # the tensor-core inner products (float64, 3xTF32), split by the last block or in a
    # cluster
    for mma, (ak, bk), (split, cluster) in itertools.product(
            ({"F64MMA": 1}, {"TF32X3": 1}),
            ((1, 1), (1, 0), (0, 0)), ((0, 0), (1, 0), (0, 4))):
        for flags in ({"HAS_BIAS": 1, "RELU": 1, "AUX_OUT": 1}, {"DRELU": 1, "BGRAD": 1}, {}):
            G._kernel(ak, bk, 2, 2, G.BK, SPLIT=split, CLUSTER=cluster, **mma, **flags)
    sources = list(_Recorder.sources)
    for cache in caches:
        cache.cache_clear()  # no recorder objects left behind for real launches
    return sources


def test_every_generated_kernel_compiles(monkeypatch):
    sources = _generated_sources(monkeypatch)
    assert len(sources) > 200
    failures = []
    for name, code in sources:
        prog = NVRTC.createProgram(code, f"{name}.cu", [], [])
        try:
            NVRTC.compileProgram(prog, ["-arch=compute_90", "-std=c++17", f"-I{INCLUDE}"])
        except Exception:  # noqa: BLE001 - collect the log of every failing variant
            failures.append(f"{name}:\n{NVRTC.getProgramLog(prog)[:2000]}\n{code[:1500]}")
        finally:
            NVRTC.destroyProgram(prog)
    assert not failures, f"{len(failures)} of {len(sources)} failed; first:\n{failures[0]}"
