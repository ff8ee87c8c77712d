"""The CUDA backend: CuPy arrays, nvmath-python cuBLASLt matmuls with fused epilogs.

A cuBLASLt matmul is a planned ``nvmath.linalg.advanced.Matmul`` taken from a plan cache
keyed by everything that makes a plan (stage, epilog, shapes, strides, dtype, compute type,
device, operand alignment). A cache hit swaps the operands in (``reset_operands_unchecked``:
safe because the key already pins shape, strides, dtype, device and alignment) and executes.

Where cuBLASLt was measured slower on the H200 (docs/benchmarks.md), a dense op runs one of
fuseflow's own kernels instead, chosen in ``_linear_impl``, ``_dgrad_impl`` and
``_wgrad_impl`` by the settings of ``__init__``:
``_cuda_skinny`` / ``_cuda_skinny_tc`` (at most 32 features on one side: the output layer),
``_cuda_epilogs`` (a plain matmul plus an in-place bias/ReLU or DRELU/bias-gradient pass:
full float32, and large ReLU input gradients; at small outputs the backend splits that
matmul's K itself and the pass adds the slices, ``_k_split``), and ``_cuda_gemm``
(full-float32 matmuls with the epilog inside; off by default, for experiments). All of
them match the cuBLASLt epilogs' formats (relu_aux bits, bias gradients), and the tests
check each against the NumPy reference.

Orientation (cuBLASLt is column-major; activations are row-major ``(batch, features)``):

============  ===========================  ====================  =========================
stage         cuBLASLt product             M, N, K               D (column-major) is
============  ===========================  ====================  =========================
forward       ``y.T = W @ x.T``            out, batch, in        ``y`` (batch, out), C order
dgrad         ``dx.T = W.T @ dy.T``        in, batch, out        ``dx`` (batch, in), C order
wgrad         ``dw.T = x.T @ dy``          in, out, batch        ``dw`` (out, in), C order
============  ===========================  ====================  =========================

Forward epilogs with neither bias nor aux (DEFAULT, RELU, GELU) are planned as
``y = x @ W.T`` instead: nothing then fixes D's layout and nvmath lays D out like A, so
A = x (row-major) gives a row-major y directly.

- ``bias`` (forward) is per row of D = per output feature. DRELU_BGRAD/DGELU_BGRAD give the
  row sums of the masked dx.T (the lower layer's bias gradient); BGRADB sums B = dy over K =
  batch (this layer's bias gradient).
- relu_aux is returned exactly as cuBLASLt writes it. gelu_aux: nvmath allocates it with
  ``round_up(F, 8)`` rows (cuBLASLt needs the aux leading dimension to be a multiple of 8);
  the backend returns the ``(F, batch)`` view of that buffer and hands the padded buffer
  back to cuBLASLt in the backward without a copy.
- Fallbacks, all transparent and counted in ``stats()["fallbacks"]``: DRELU/DGELU with
  K == 1 (cuBLASLt refuses it) and any epilog that cuBLASLt refuses to plan run as a plain
  matmul plus an epilog pass (``_cuda_epilogs`` where its vectorized form applies, else
  the CuPy kernels of ``_cuda_kernels``). Layout fixes (non-contiguous inputs,
  a misaligned bias, an aux with other strides) are copies counted in ``stats()["copies"]``.
- cuBLASLt's GELU epilogs approximate the tanh-GELU (float32: ~5e-6 absolute; float64:
  ~3e-10); fuseflow's own GELU kernels use numpy_backend's exact formula.

Precision: float16 accumulates in float32 (COMPUTE_32F), float32 runs full fp32 by default
(``tf32=True`` or ``FUSEFLOW_TF32=1`` selects COMPUTE_32F_FAST_TF32), float64 COMPUTE_64F.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter, OrderedDict

import cupy
import numpy as np
import nvmath
from nvmath.linalg.advanced import Algorithm, Matmul, MatmulEpilog

from fuseflow import random
from fuseflow._dtypes import FLOATS, bfloat16, is_half
from fuseflow.backend import _cuda_autotune as _autotune
from fuseflow.backend import _cuda_epilogs as E
from fuseflow.backend import _cuda_gemm as G
from fuseflow.backend import _cuda_head as H
from fuseflow.backend import _cuda_kernels as K
from fuseflow.backend import _cuda_overlap
from fuseflow.backend import _cuda_random
from fuseflow.backend import _cuda_skinny as S
from fuseflow.backend import _cuda_skinny_tc as TC
from fuseflow.backend import _cuda_tc_head as HD
from fuseflow.backend import _cuda_wgmma as W
from fuseflow.backend import _k_split
from fuseflow.backend._env import AUTOTUNE_MODES, env_auto_int, env_choice, env_int, env_subset
from fuseflow.backend.base import DLPACK_GPU_DEVICES, Backend, BackendError, from_dlpack
from fuseflow.backend.epilogs import DGRAD_EPILOGS, relu_aux_rows

__all__ = ["CudaBackend", "GPUOutOfMemoryError"]

_CT = nvmath.linalg.ComputeType
_LOG = logging.getLogger("fuseflow.nvmath")
_LOG.setLevel(logging.WARNING)  # nvmath logs at INFO per call; keep it quiet unless asked

#: CuPy takes ml_dtypes' bfloat16 from version 14 on.
_BFLOAT16 = int(cupy.__version__.split(".")[0]) >= 14
_DTYPES = FLOATS if _BFLOAT16 else tuple(d for d in FLOATS if d != bfloat16)
_AUX_ALIGN = 16  # bytes; epilog bias/aux pointers are kept at least this aligned


class GPUOutOfMemoryError(BackendError, MemoryError):
    """The GPU ran out of memory for an operation (catchable as MemoryError too)."""


class _Unfused:
    """Plan-cache marker: this key runs unfused (plain matmul + CuPy kernels)."""

    __slots__ = ("reason",)

    def __init__(self, reason):
        self.reason = reason


#: FUSEFLOW_OWN_EPILOG's modes (see ``CudaBackend.own_epilog``)
OWN_EPILOG_MODES = ("auto", "fp32", "all", "off")
#: "auto" runs 16-bit DGELU[_BGRAD] through the own pass from this many batch x features
#: on: measured faster at 784-4096-4096-10's 8192 x 4096 (call 182, an H100: 12-13% on the
#: whole bf16 step, call 185) and at 784-1024-1024-10's 256 x 1024 (call 187: its bf16
#: steps 3-4% faster side by side). Shorter ones keep cuBLASLt's fused 16-bit epilog,
#: which no call has compared there.
HALF_DGELU_MIN = 2 ** 18
#: the dense ops that may run the skinny kernels (``FUSEFLOW_SKINNY_OPS``)
SKINNY_OPS = ("forward", "wgrad", "dgrad")


def _align(ptr: int) -> int:
    return min(256, ptr & -ptr) if ptr else 256


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.2f} TiB"


def _is_oom(e: BaseException) -> bool:
    if isinstance(e, cupy.cuda.memory.OutOfMemoryError):
        return True
    msg = str(e)
    return "out of memory" in msg.lower() or "cudaErrorMemoryAllocation" in msg \
        or "CUDA_ERROR_OUT_OF_MEMORY" in msg or "ALLOC_FAILED" in msg


def _grad_in_logits_dtype(dtype, grad_scale, grad_dtype) -> bool:
    """The fused loss kernels write the loss gradient in the logits' ``dtype``: whether
    ``softmax_cross_entropy(..., grad_scale, grad_dtype)`` asks for that, with a scale a
    kernel reads (a 0-d float32 device array; float16 logits get float32 gradients by
    default there, and float64 logits are not scaled in a kernel)."""
    if grad_scale is None:
        return grad_dtype is None or np.dtype(grad_dtype) == dtype
    return (dtype != np.float64 and isinstance(grad_scale, cupy.ndarray)
            and grad_scale.dtype == np.float32 and grad_scale.ndim == 0
            and np.dtype(grad_dtype or np.float32) == dtype)


class CudaBackend(Backend):
    name = "cuda"
    device = "cuda"
    xp = cupy
    dtypes = _DTYPES

    def __init__(self, *, tf32: bool | None = None, autotune: bool | None = None,
                 max_plans: int = 512):
        super().__init__()
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device is visible")
        #: float32 matmuls on TF32 tensor cores (COMPUTE_32F_FAST_TF32) instead of full fp32.
        self.tf32 = env_choice("FUSEFLOW_TF32", {"1": True, "0": False}, False) \
            if tf32 is None else tf32
        #: time cuBLASLt's candidate algorithms for each new plan (``_cuda_autotune``) and keep
        #: the fastest: True, False or "auto" (large float32 matmuls only); ``ff.compile``
        #: sets its own mode while it plans a step (default "auto"), eager calls default off.
        if autotune is None:
            autotune = env_choice("FUSEFLOW_AUTOTUNE", AUTOTUNE_MODES, False)
        if autotune not in AUTOTUNE_MODES.values():
            raise ValueError(f"CudaBackend: autotune must be True, False or 'auto', got "
                             f"{autotune!r}")
        self.autotune = autotune
        self.max_plans = max_plans
        #: From this many multiply-adds up, DRELU/DGELU_BGRAD runs as the plain matmul plus
        #: the own epilog pass (``own_epilog`` "auto"), or with ``own_epilog`` "fp32" or
        #: "off" as DRELU/DGELU plus the bias-sum kernel: measured faster at large shapes
        #: (benchmarks/seed_epilogs.py: 28.66 vs 29.46 ms at 65536x8192x16384), where
        #: cuBLASLt's BGRAD algorithms are slow.
        self.split_bias_grad_macs = env_int("FUSEFLOW_SPLIT_BIAS_GRAD_MACS", 2 ** 32)
        #: Dense matmuls whose output (forward, wgrad) or input-gradient reduction (dgrad) side
        #: has at most this many features run fuseflow's one-kernel ``_cuda_skinny`` forms
        #: instead of cuBLASLt (ReLU or no activation; the forward also GELU; at most 32;
        #: 0 turns them off).
        self.skinny_max = min(S.MAX_N, env_int("FUSEFLOW_SKINNY_MAX", S.MAX_N))
        #: which of them: any of "forward", "wgrad", "dgrad" (``FUSEFLOW_SKINNY_OPS``).
        self.skinny_ops = env_subset("FUSEFLOW_SKINNY_OPS", SKINNY_OPS, ",".join(SKINNY_OPS))
        #: 16-bit ones with at most 16 on the small side and long batches run their
        #: tensor-core forms (``_cuda_skinny_tc``; the forward too, instead of cuBLASLt),
        #: FUSEFLOW_SKINNY_TC=0 keeps the SIMT kernels.
        self.skinny_tc = env_choice("FUSEFLOW_SKINNY_TC", {"1": True, "0": False}, True)
        #: A classifier's output layer, its softmax cross-entropy and its input gradient
        #: (ReLU mask or GELU derivative of the layer below) run as one ``_cuda_head``
        #: kernel at the skinny SIMT kernels' shapes (short batches); FUSEFLOW_FUSED_HEAD=0
        #: runs the three.
        self.fused_head = env_choice("FUSEFLOW_FUSED_HEAD", {"1": True, "0": False}, True)
        #: Where both gradients of a layer would be the tensor-core skinny kernels, one
        #: ``_cuda_skinny_tc.grads`` pass takes them (``linear_grads``: x read once, dx
        #: written once; dx is allocated while x is still alive). On by default since call
        #: 139 (H100): the compiled bfloat16 large Adam step 1,547 against 1,561 us without
        #: it (medians of four alternating rounds, faster in three); the pass alone 71.4
        #: against 81.9 us for the two kernels (call 116). Call 155 (H100, three rounds):
        #: float16 1,623.8 against 1,630.5 us, bfloat16 1,584.6 against 1,609.1. The H200 is
        #: not measured yet. FUSEFLOW_FUSED_SKINNY_GRADS=0 runs the two kernels.
        self.fused_skinny_grads = env_choice("FUSEFLOW_FUSED_SKINNY_GRADS",
                                             {"1": True, "0": False}, True)
        #: Where a classifier's output layer takes its tensor-core forward (16-bit, long
        #: batches), its softmax cross-entropy runs in the same kernel (``linear_xent``:
        #: two launches fewer); FUSEFLOW_FUSED_TC_XENT=0 runs the forward and the loss apart.
        self.fused_tc_xent = env_choice("FUSEFLOW_FUSED_TC_XENT", {"1": True, "0": False}, True)
        #: Where a classifier's output layer would take ``linear_xent`` and both gradients
        #: would be ``linear_grads``' tensor-core pass (16-bit, at most 16 classes, long
        #: batches), one cluster launch takes the logits, the loss and both gradients,
        #: reading the layer's input once instead of twice (``_cuda_tc_head``; compute
        #: capability 9.0); FUSEFLOW_FUSED_TC_HEAD=1 turns it on (off by default: in the
        #: compiled 16-bit steps it measured 0.998x, call 219, docs/gpu.md).
        self.fused_tc_head = env_choice("FUSEFLOW_FUSED_TC_HEAD", {"1": True, "0": False},
                                        False)
        #: Bias/ReLU and bias/GELU epilogs (forward, DRELU[_BGRAD], DGELU[_BGRAD]; the GELU
        #: forward not with TF32 nor in 16 bits: cuBLASLt's fused GELU forward is the faster
        #: one there, calls 174-175 and 182) run as a plain matmul plus fuseflow's in-place
        #: ``_cuda_epilogs`` pass (FUSEFLOW_OWN_EPILOG[_MIN]):
        #: "fp32": in float32 (full or TF32) from ``own_epilog_min`` batch x features on,
        #: where cuBLASLt has no fused epilog and runs a slow separate one (with TF32 too:
        #: its sm90 TF32 kernels hand RELU_AUX_BIAS to ``epilogue::impl::globalKernel``,
        #: 285 us for an 8192 x 4096 output against 89 us for XLA's fused pass; measured
        #: in the thirty-sixth session on an H100, calls 171-172: the compiled TF32 steps
        #: 7-9% faster, 784-4096-4096-10 at batch 8192 3,604 against 3,906 us (SGD) and
        #: 3,604 against 3,951 (Adam), 784-1024-1024-10 70.6 against 76.1 and 89.6
        #: against 96.5); "auto" (default): also DRELU/DGELU input gradients of any dtype
        #: from ``split_bias_grad_macs`` on, where cuBLASLt's DRELU kernels are slower than
        #: its plain ones, and 16-bit DGELU[_BGRAD] from ``HALF_DGELU_MIN`` on (cuBLASLt ran
        #: the 784-4096-4096-10 output layer's as a SIMT matmul plus a 307 us epilog kernel,
        #: the plain matmul and fuseflow's pass took 40 + 83 us; call 182 on an H100);
        #: "all": always (tests); "off": never.
        self.own_epilog = env_choice("FUSEFLOW_OWN_EPILOG", {m: m for m in OWN_EPILOG_MODES},
                                     "auto")
        self.own_epilog_min = env_int("FUSEFLOW_OWN_EPILOG_MIN", 2 ** 18)
        #: How an input gradient without a cuBLASLt epilog, ``dx = dy @ w``, is handed to
        #: cuBLASLt (FUSEFLOW_DGRAD_ORIENTATION): "nn" as ``w.T @ dy.T`` (both operands
        #: column-major), "tt" as ``dy @ w`` (both row-major). The same product; cuBLASLt's
        #: heuristic picks different kernels for the two.
        self.dgrad_orientation = env_choice("FUSEFLOW_DGRAD_ORIENTATION",
                                            {"nn": "nn", "tt": "tt"}, "nn")
        #: Those own-epilog matmuls (full float32 forwards and ReLU input gradients) may
        #: split K themselves (``FUSEFLOW_K_SPLITS``): one strided-batched cuBLASLt matmul
        #: writes the K slices' partial products and the epilog pass adds them in split
        #: order as it reads them, in place of cuBLASLt's split-K reduction kernel (one
        #: launch and one pass over the output fewer; ``_k_split``). "auto" (default):
        #: small outputs with a long K, in the fewest slices of at most 400 elements; a
        #: number: that many slices wherever they divide K into multiples of 4 elements
        #: (0 or 1: never). Not for float16 (its partial products would be rounded).
        self.k_splits = env_auto_int("FUSEFLOW_K_SPLITS")
        #: Full-float32 dense matmuls (no TF32) of up to this many multiply-adds run
        #: fuseflow's ``_cuda_gemm`` (one launch with the epilog inside) instead of
        #: cuBLASLt's SIMT kernels plus a split-K reduction and an epilog pass
        #: (``FUSEFLOW_OWN_GEMM_MAX_MACS``; 0 turns it off).
        self.own_gemm_max_macs = env_int("FUSEFLOW_OWN_GEMM_MAX_MACS", G.DEFAULT_MAX_MACS)
        #: its inner product (``FUSEFLOW_OWN_GEMM_MMA``): "simt" (float32 FMAs), "f64"
        #: (the float64 tensor cores, each float32 product exact, rounded once at the end)
        #: or "tf32x3" (3xTF32 on the TF32 tensor cores, as accurate as float32 FMAs).
        self.own_gemm_mma = env_choice("FUSEFLOW_OWN_GEMM_MMA", {m: m for m in G.MMAS}, G.MMA)
        #: Full-float32 dense matmuls (no TF32) on a Hopper GPU as 3xTF32 on the tensor cores
        #: (``_cuda_wgmma``; FUSEFLOW_FP32_WGMMA): "3xtf32-lotrunc" (default; hi rounded to
        #: nearest TF32, lo left for the tensor cores to truncate: 2.40-2.61e-7 against
        #: float64 at the medium products, cuBLASLt's float32 1.5-2.9e-7, call 200),
        #: "3xtf32" (hi and lo rounded: 2.36-2.56e-7, a few instructions more),
        #: "3xtf32-chop" (a cheaper split, about twice float32's error: 5.4-5.6e-7) or
        #: "off" (cuBLASLt's SIMT kernels; also wherever the GPU is not compute capability
        #: 9.0). Measured side by side (call 200, an H100), the medium model's compiled fp32
        #: SGD step: off 106.2 us, "3xtf32" 86.2, "3xtf32-lotrunc" 82.0, "3xtf32-chop"
        #: 78.2 (Adam 124.1 / 105.3 / 101.3 / 99.4). They
        #: replace the products of the own-epilog forwards and ReLU input gradients (their
        #: K slices added by the epilog pass; how many: ``_cuda_wgmma.slices_for`` where
        #: ``k_splits`` is "auto", else ``k_splits``) and of the weight gradients that need
        #: no K split (the others stay on cuBLASLt, which splits K itself).
        self.fp32_wgmma = env_choice("FUSEFLOW_FP32_WGMMA",
                                     {m: m for m in ("off", *W.SPLITS)}, W.DEFAULT_SPLIT)
        #: Weight gradients that a backward pass asks to overlap (``Serial`` does, for its
        #: dense layers) run on a second stream beside the input-gradient chain
        #: (``_cuda_overlap``), FUSEFLOW_OVERLAP_WGRAD: "auto" (default) those in full
        #: float32 whose inputs (kept alive until the join) are at most
        #: ``overlap_max_bytes``, True all, False none. Measured on the H200
        #: (docs/benchmarks.md): full-float32 steps of the small and medium models 4-8%
        #: faster; TF32 medium steps 3-4% slower (their tensor-core kernels already fill the
        #: GPU, and two of them slow each other down more); the batch-8192 step no faster,
        #: its compiled pool 0.96x -> 1.15x of what must be alive (a 134 MB input kept).
        #: Not even the memory-bound float16 output layer's weight gradient of the 16-bit
        #: batch-8192 step gains: beside cuBLASLt's kernels, which fill every SM, it ran
        #: 41 us against 30 alone, and the steps 1.3% (SGD) and 1.6% (Adam) slower (call 62).
        self.overlap_wgrad = env_choice("FUSEFLOW_OVERLAP_WGRAD", AUTOTUNE_MODES, "auto")
        self.overlap_max_bytes = env_int("FUSEFLOW_OVERLAP_MAX_BYTES", 2 ** 24)
        #: FUSEFLOW_OVERLAP_ORDER: "early" (default) forks an overlapped weight gradient
        #: before its layer's input gradient, so that it runs beside it, and runs the lowest
        #: layer's (nothing follows it on the main stream) on the main stream; "after" forks
        #: each one once its layer's input gradient is issued (beside the next layer's
        #: work), the lowest layer's on the main stream; "before" forks every one before
        #: its layer's input gradient, the lowest layer's too. Measured on the H200
        #: (docs/benchmarks-log.md): call 57, 784-30-10's compiled full-fp32 steps 15-20% faster
        #: with "after" than "before", 784-1024-1024-10's within 1%; call 101, with the
        #: split update and two side streams, 784-1024-1024-10 Adam 120.5 us "early"
        #: against 136.1 "after" (SGD 107.2 against 119.0), 784-30-10 within 1 us.
        self.overlap_order = env_choice("FUSEFLOW_OVERLAP_ORDER",
                                        {o: o for o in ("before", "after", "early")}, "early")
        #: FUSEFLOW_OVERLAP_STREAMS (default 2): side streams per main stream, taken in
        #: turn by successive overlapped weight gradients, so that a short one forked first
        #: (the output layer's) does not hold up the next behind it. Measured (call 101,
        #: "early", split update): 784-1024-1024-10 Adam 120.5 us against 123.2 with one,
        #: SGD 107.2 against 112.2; 784-30-10 Adam 28.6 against 28.0, SGD 22.5 against 22.3.
        self.overlap_streams = max(1, env_int("FUSEFLOW_OVERLAP_STREAMS", 2))
        #: FUSEFLOW_SPLIT_UPDATE: in a compiled step, the fused optimizer update right
        #: after ``Serial``'s backward updates the leaves whose gradients the side stream
        #: made on that stream, as soon as they are ready, beside the main stream's last
        #: weight gradient (``_cuda_overlap.SplitPoint``): two launches instead of one.
        #: "auto" (default): where those leaves hold at least ``split_update_min_elements``
        #: (``FUSEFLOW_SPLIT_UPDATE_MIN``, 2^18); 1 always, 0 never. Measured on the H200
        #: (call 99): 784-1024-1024-10 Adam 131.5 -> 128.1 us, SGD 113.7 -> 112.4; but
        #: 784-30-10 Adam 27.9 -> 30.4 (its 24K-element update is shorter than a launch).
        #: Counted in ``stats()["split_update"]``.
        self.split_update = env_choice("FUSEFLOW_SPLIT_UPDATE", AUTOTUNE_MODES, "auto")
        self.split_update_min_elements = env_int("FUSEFLOW_SPLIT_UPDATE_MIN", 2 ** 18)
        self._local = threading.local()  # .overlap: this thread's open OverlapScope
        self._plans: OrderedDict = OrderedDict()
        self._recording = None  # the plans list of an active recording_plans()
        self._counters = Counter()
        self._planning_s = 0.0
        self._fallbacks = Counter()
        self._copies = Counter()

    # ---- stats -----------------------------------------------------------------------------
    def stats(self) -> dict:
        s = super().stats()
        s.update({
            "plans": self._counters["plans"],
            "planning_s": self._planning_s,
            "cache_hits": self._counters["cache_hits"],
            "executions": self._counters["executions"],
            "cache_size": len(self._plans),
            "evictions": self._counters["evictions"],
            "fallbacks": dict(self._fallbacks),
            "split_bias_grad": self._counters["split_bias_grad"],
            "skinny": self._counters["skinny"],
            "skinny_tc": self._counters["skinny_tc"],
            "fused_head": self._counters["fused_head"],
            "fused_skinny_grads": self._counters["fused_skinny_grads"],
            "fused_tc_xent": self._counters["fused_tc_xent"],
            "fused_tc_head": self._counters["fused_tc_head"],
            "own_epilog": self._counters["own_epilog"],
            "k_split": self._counters["k_split"],
            "own_gemm": self._counters["own_gemm"],
            "wgmma": self._counters["wgmma"],
            "overlapped_wgrad": self._counters["overlapped_wgrad"],
            "split_update": self._counters["split_update"],
            "split_update_overlapped": self._counters["split_update_overlapped"],
            "copies": dict(self._copies),
            "tf32": self.tf32,
        })
        return s

    def reset_stats(self):
        super().reset_stats()
        self._counters.clear()
        self._planning_s = 0.0
        self._fallbacks.clear()
        self._copies.clear()

    def clear_plans(self):
        """Drop every cached plan (they are re-made on next use)."""
        while self._plans:
            _, mm = self._plans.popitem(last=False)
            self._drop(mm)

    @staticmethod
    def _drop(mm):
        """Release a plan leaving the cache. One that a CUDA graph captured is only
        dropped, never freed: the graph (``ff.compile``) holds it, and with it the workspace
        whose address the graph replays; the graph's end lets it go."""
        if isinstance(mm, Matmul) and not getattr(mm, "ff_captured", False):
            mm.free()

    @contextlib.contextmanager
    def recording_plans(self):
        """``with be.recording_plans() as plans:`` collects the plans executed inside and
        marks them captured (a graph capture keeps the list: the plans live as long as it)."""
        previous, self._recording = self._recording, []
        try:
            yield self._recording
        finally:
            if previous is not None:
                previous.extend(self._recording)
            self._recording = previous

    # ---- random numbers --------------------------------------------------------------------
    def _random(self, key, shape, dtype, rate, stream=0):
        if dtype is not None:
            self._check_dtype("dropout_scale", dtype)
        return _cuda_random.bits_or_scale(self._device_key(key), shape, dtype, rate, stream)

    def _dropout(self, key, x, rate):
        if not (isinstance(x, cupy.ndarray) and x.flags.c_contiguous):
            return super()._dropout(key, x, rate)
        self._check_dtype("dropout", x.dtype)
        return _cuda_random.bits_or_scale(self._device_key(key), x.shape, x.dtype, rate, x=x)

    def _device_key(self, key):
        """The key as a (2,) uint32 CuPy array. A host key is copied to the GPU, which a
        compiled step cannot do while it is captured: there it must arrive on the GPU."""
        if not isinstance(key, (cupy.ndarray, np.ndarray)) and hasattr(key, "__dlpack_device__") \
                and key.__dlpack_device__()[0] in DLPACK_GPU_DEVICES:
            key = cupy.from_dlpack(key)  # a torch / JAX GPU key, read in place
        if isinstance(key, cupy.ndarray):
            if key.shape != (2,) or key.dtype != np.uint32:
                raise BackendError(f"random numbers: expected a key (uint32 array of shape "
                                   f"(2,)), got dtype {key.dtype} shape {key.shape}. Fix: "
                                   "ff.device_put(ff.random.key(seed), 'cuda').")
            return cupy.ascontiguousarray(key)
        key = random._check_key(None if key is None else self.to_numpy(key), "random numbers")
        if cupy.cuda.get_current_stream().is_capturing():
            raise BackendError(
                "random numbers inside a compiled step (ff.compile): the key is a host array, "
                "and a CUDA graph cannot copy host memory. Fix: pass the key to the step as "
                "an argument on the GPU, e.g. step(params, opt_state, x, y, "
                "ff.device_put(key, 'cuda')); the graph then copies each call's key in.")
        return cupy.asarray(key)

    # ---- placement -------------------------------------------------------------------------
    def asarray(self, x, dtype=None):
        """NumPy -> device copy; CuPy as is; GPU DLPack producers (torch, JAX) without a copy."""
        if isinstance(x, cupy.ndarray):
            out = x
        elif isinstance(x, np.ndarray):
            out = cupy.asarray(x)
        elif hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__") \
                and x.__dlpack_device__()[0] in DLPACK_GPU_DEVICES:
            out = from_dlpack(cupy.from_dlpack, x)
        elif hasattr(x, "__dlpack__"):
            out = cupy.asarray(from_dlpack(np.from_dlpack, x))
        else:
            out = cupy.asarray(np.asarray(x))
        return out if dtype is None else out.astype(dtype, copy=False)

    def to_numpy(self, x):
        if isinstance(x, cupy.ndarray):
            return cupy.asnumpy(x)
        if isinstance(x, np.ndarray):
            return x
        if hasattr(x, "__dlpack_device__") and x.__dlpack_device__()[0] in DLPACK_GPU_DEVICES:
            return cupy.asnumpy(cupy.from_dlpack(x))
        return np.asarray(x)

    # ---- checks ----------------------------------------------------------------------------
    def _check_device(self, op, **arrays):
        dev = None
        for k, a in arrays.items():
            if a is None:
                continue
            if not isinstance(a, cupy.ndarray):
                where = "a NumPy array on the host" if isinstance(a, np.ndarray) \
                    else f"a {type(a).__module__}.{type(a).__name__}"
                raise BackendError(
                    f"{op}: {k} is {where}, but the cuda backend needs CuPy arrays on the GPU. "
                    "Fix: ff.device_put(x, 'cuda') for inputs (or put the model on the CPU "
                    "with ff.device_put(params, 'cpu')).")
            d = a.device.id
            if dev is None:
                dev = d
            elif d != dev:
                raise BackendError(f"{op}: operands are on different GPUs ({k} is on device {d}, "
                                   f"others on {dev}). Fix: move them to one device.")
        return dev

    def _check_dtype(self, op, dtype):
        if np.dtype(dtype) not in _DTYPES:
            fix = ("bfloat16 needs CuPy 14 or newer: pip install -U cupy-cuda12x (or 13x), "
                   "or use float16" if np.dtype(dtype) == bfloat16 else
                   f"use one of {', '.join(d.name for d in _DTYPES)} (e.g. x.astype('float32'))")
            raise BackendError(f"{op}: dtype {np.dtype(dtype)} is not supported by the cuda "
                               f"backend here. Fix: {fix}.")

    def _contig(self, what, a):
        """C-contiguous ``a`` (copy only if needed, counted)."""
        if a.flags.c_contiguous:
            return a
        self._copies[what] += 1
        return cupy.ascontiguousarray(a)

    def _prep_bias(self, bias):
        if bias.strides[0] == bias.itemsize and bias.data.ptr % _AUX_ALIGN == 0:
            return bias
        self._copies["bias"] += 1
        return cupy.array(bias)  # fresh, contiguous and aligned

    def _relu_aux_for_cublas(self, aux, rows, batch):
        """relu_aux with exactly the layout cuBLASLt reads: strides (1, rows), aligned."""
        ok = aux.strides[0] == 1 and (batch == 1 or aux.strides[1] == rows) \
            and aux.data.ptr % _AUX_ALIGN == 0
        if ok:
            return aux
        self._copies["relu_aux"] += 1
        out = cupy.empty((rows, batch), dtype=cupy.uint8, order="F")
        out[...] = aux
        return out

    def _gelu_aux_for_cublas(self, aux, features, batch):
        """The (round_up(F, 8), batch) column-major buffer cuBLASLt reads, without a copy
        when ``aux`` is a view of one (as returned by the forward)."""
        s = aux.itemsize
        m8 = _round_up(features, 8)
        if aux.strides[0] == s and (batch == 1 or aux.strides[1] == m8 * s) \
                and aux.data.ptr % _AUX_ALIGN == 0:
            if m8 == features:
                return aux
            mem = aux.data.mem
            if aux.data.ptr + m8 * batch * s <= mem.ptr + mem.size:
                return cupy.ndarray((m8, batch), dtype=aux.dtype, memptr=aux.data,
                                    strides=(s, m8 * s))
        self._copies["gelu_aux"] += 1
        out = cupy.zeros((m8, batch), dtype=aux.dtype, order="F")
        out[:features] = aux
        return out

    def _aux_ld(self, aux, rows, batch):
        """Leading dimension (elements) of a column-major aux, for the CuPy kernels."""
        if aux.strides[0] != aux.itemsize:
            return None
        return rows if batch == 1 else aux.strides[1] // aux.itemsize

    def _oom(self, op, e, arrays, outputs):
        ins = ", ".join(f"{k} {tuple(a.shape)} {a.dtype}" for k, a in arrays.items()
                        if a is not None)
        outs = ", ".join(f"{k} {tuple(shape)} {np.dtype(dt)} = "
                         f"{_fmt_bytes(float(np.prod(shape)) * np.dtype(dt).itemsize)}"
                         for k, shape, dt in outputs())
        try:
            free, total = cupy.cuda.runtime.memGetInfo()
            pool = cupy.get_default_memory_pool()
            mem = (f" The GPU has {_fmt_bytes(free)} free of {_fmt_bytes(total)}; CuPy's pool "
                   f"holds {_fmt_bytes(pool.total_bytes())} ({_fmt_bytes(pool.free_bytes())} of "
                   "it cached, unused).")
        except Exception:  # noqa: BLE001 - best effort, only for the message
            mem = ""
        return GPUOutOfMemoryError(
            f"out of GPU memory in {op} (inputs: {ins}; outputs asked for: {outs}).{mem} "
            "Fix: use a smaller batch size (or smaller layers); free arrays you no longer need "
            "(del them, then cupy.get_default_memory_pool().free_all_blocks()).")

    # ---- the plan cache --------------------------------------------------------------------
    def _compute_type(self, dtype):
        if dtype == np.float64:
            return _CT.COMPUTE_64F
        if dtype == np.float32 and self.tf32:
            return _CT.COMPUTE_32F_FAST_TF32
        return _CT.COMPUTE_32F

    def _matmul(self, stage, epilog, a, b, inputs):
        """Plan (or take from the cache) and execute ``a @ b`` with ``epilog``.

        Returns ``(D, aux_outputs_dict)``, or None when this key runs unfused (cuBLASLt
        refused the epilog; the caller then computes it from a plain matmul).
        """
        ct = self._compute_type(a.dtype)
        key = (stage, epilog, a.shape, a.strides, _align(a.data.ptr), b.shape, b.strides,
               _align(b.data.ptr), a.dtype.char, int(ct), a.device.id,
               tuple((k, v.shape, v.strides, v.dtype.char) for k, v in inputs.items()))
        mm = self._plans.get(key)
        if self.autotune and isinstance(mm, Matmul) and \
                getattr(mm, "ff_tuned", False) not in (True, self.autotune):
            del self._plans[key]  # planned under a narrower mode: plan again, maybe tuned
            self._drop(mm)
            mm = None
        fresh = mm is None
        if fresh:
            mm = self._plan(key, stage, epilog, a, b, inputs, ct)
        else:
            self._plans.move_to_end(key)
            self._counters["cache_hits"] += 1
        if isinstance(mm, _Unfused):
            self._fallbacks[mm.reason] += 1
            return None
        if not fresh:
            mm.reset_operands_unchecked(a=a, b=b, epilog_inputs=inputs or None)
        if self._recording is not None:
            mm.ff_captured = True  # from now on only dropped, never freed (see _drop)
            self._recording.append(mm)
        try:
            out = mm.execute()
        except Exception as e:
            if _is_oom(e):
                raise
            if not fresh or epilog is None:
                raise
            # cuBLASLt planned the epilog but refuses to run it: remember, run unfused.
            reason = f"{stage}/{epilog}: execute failed ({type(e).__name__})"
            self._plans[key] = _Unfused(reason)
            self._drop(mm)
            self._fallbacks[reason] += 1
            return None
        finally:
            if isinstance(mm, Matmul) and mm.valid_state:
                mm.release_operands()  # the cache must not keep the caller's arrays alive
        self._counters["executions"] += 1
        if isinstance(out, tuple):
            return out
        return out, {}

    def _plan(self, key, stage, epilog, a, b, inputs, ct):
        t0 = time.perf_counter()
        mm = None
        try:
            mm = Matmul(a, b, options={"compute_type": ct, "logger": _LOG})
            ep = None if epilog is None else MatmulEpilog[epilog]
            tune = _autotune.wanted(self.autotune, int(np.prod(a.shape)) * b.shape[-1],
                                    a.dtype)
            algorithms = mm.plan(preferences={"limit": _autotune.LIMIT} if tune else None,
                                 epilog=ep, epilog_inputs=inputs or None)
            if tune and len(algorithms) > 1:
                best, _ = _autotune.fastest(mm, algorithms)
                best = Algorithm.from_numpy(best.as_numpy())
                mm.free()  # its workspace is sized for the largest candidate
                mm = Matmul(a, b, options={"compute_type": ct, "logger": _LOG})
                mm.plan(algorithms=[best], epilog=ep, epilog_inputs=inputs or None)
            mm.ff_tuned = self.autotune  # the mode it was planned under
        except Exception as e:
            if mm is not None:
                mm.free()
            if _is_oom(e) or epilog is None:
                raise
            mm = _Unfused(f"{stage}/{epilog}: cuBLASLt refused ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:120]})")
        else:
            self._counters["plans"] += 1
        finally:
            self._planning_s += time.perf_counter() - t0
        self._plans[key] = mm
        while len(self._plans) > self.max_plans:
            _, old = self._plans.popitem(last=False)
            self._counters["evictions"] += 1
            self._drop(old)
        return mm

    def _guard(self, op, fn, arrays, outputs):
        """Run ``fn`` on the operands' device, turning OOM into a clear BackendError."""
        dev = next(iter(arrays.values())).device.id
        try:
            if dev != cupy.cuda.runtime.getDevice():
                with cupy.cuda.Device(dev):
                    return fn()
            return fn()
        except GPUOutOfMemoryError:
            raise
        except Exception as e:
            if _is_oom(e):
                raise self._oom(op, e, arrays, outputs) from e
            raise

    # ---- dense matmuls ---------------------------------------------------------------------
    def _linear(self, x, w, bias, spec):
        op = f"linear/{spec.name}"
        self._check_device(op, x=x, w=w, bias=bias)
        self._check_dtype(op, x.dtype)
        x, w = self._contig("x", x), self._contig("w", w)
        batch, out = x.shape[0], w.shape[0]

        def outputs():
            o = [("y", (batch, out), x.dtype)]
            if spec.aux:
                o.append((f"{spec.activation}_aux",
                          (relu_aux_rows(out), batch) if spec.activation == "relu"
                          else (_round_up(out, 8), batch),
                          np.uint8 if spec.activation == "relu" else x.dtype))
            return o

        return self._guard(op, lambda: self._linear_impl(x, w, bias, spec),
                           {"x": x, "w": w, "bias": bias}, outputs)

    def _takes_skinny(self, op, n, activation) -> bool:
        """Whether ``op`` with small side ``n`` may run its SIMT skinny kernel (GELU: the
        forward only); counts nothing."""
        return 0 < n <= self.skinny_max and op in self.skinny_ops and \
            (activation in (None, "relu") or (activation == "gelu" and op == "forward"))

    def _skinny(self, op, n, activation):
        if self._takes_skinny(op, n, activation):
            self._counters["skinny"] += 1
            return True
        return False

    def _takes_skinny_forward(self, x, n, activation) -> bool:
        """The forward's SIMT skinny kernel (short batches, see ``_linear_impl``)."""
        return x.shape[0] * x.shape[1] * n <= S.FORWARD_MAX_MACS and \
            self._takes_skinny("forward", n, activation)

    def _takes_skinny_tc(self, op, n, supported=True) -> bool:
        """Whether ``op`` with small side ``n`` runs its tensor-core skinny form (see
        __init__), where ``supported``; counts nothing."""
        return self.skinny_tc and 0 < n <= self.skinny_max and op in self.skinny_ops \
            and supported

    def _skinny_tc(self, op, n, supported):
        """``_takes_skinny_tc``, counted in ``stats()["skinny_tc"]``."""
        if self._takes_skinny_tc(op, n, supported):
            self._counters["skinny_tc"] += 1
            return True
        return False

    def _own_gemm(self, dtype):
        """Full float32 (no TF32) with the own matmul on (see __init__)."""
        return dtype == np.float32 and not self.tf32 and self.own_gemm_max_macs > 0

    def _own_epilog(self, dtype, spec, batch, features, macs):
        """Run this bias/ReLU or bias/GELU epilog as plain matmul + ``_cuda_epilogs`` (see
        __init__)."""
        mode = self.own_epilog
        if mode == "off" or spec.name == "DEFAULT" or features % 8:
            return False
        if mode == "all":
            return True
        fp32 = mode in ("fp32", "auto") and dtype == np.float32 and \
            batch * features >= self.own_epilog_min
        # DRELU/DGELU input gradients where cuBLASLt's are slower than its plain matmuls
        big_grad = mode == "auto" and spec.stage == "dgrad" and macs >= self.split_bias_grad_macs
        if spec.activation == "gelu":
            # the forward not with TF32 nor in 16 bits: cuBLASLt's fused ones were faster
            # (calls 174-175, 182); its 16-bit DGELU was slower on long batches (call 182)
            half_grad = mode == "auto" and spec.stage == "dgrad" and is_half(dtype) and \
                batch * features >= HALF_DGELU_MIN
            return (fp32 and (spec.stage == "dgrad" or not self.tf32)) or big_grad or half_grad
        return fp32 or big_grad

    def _linear_impl(self, x, w, bias, spec):
        out = w.shape[0]
        if self._takes_skinny_forward(x, out, spec.activation):
            self._counters["skinny"] += 1
            gelu = spec.activation == "gelu"
            rows = _round_up(out, 8) if gelu else relu_aux_rows(out)
            return S.forward(x, w, self._prep_bias(bias) if spec.bias else None,
                             relu=spec.activation == "relu", gelu=gelu,
                             aux_rows=rows if spec.aux else None)
        if not spec.aux and self._skinny_tc("forward", out, TC.forward_supported(
                x, w, bias, spec.activation)):
            return TC.forward(x, w, self._prep_bias(bias) if spec.bias else None)
        if spec.activation in (None, "relu") and self._own_gemm(x.dtype):
            b = self._prep_bias(bias) if spec.bias else None
            if G.forward_supported(x, w, b, self.own_gemm_max_macs):
                self._counters["own_gemm"] += 1
                return G.forward(x, w, b, relu=spec.activation == "relu",
                                 aux_rows=relu_aux_rows(out) if spec.aux else None,
                                 mma=self.own_gemm_mma)
        if self._own_epilog(x.dtype, spec, x.shape[0], out, x.shape[0] * x.shape[1] * out):
            return self._linear_unfused(x, w, bias, spec)
        if spec.name == "DEFAULT" or not (spec.bias or spec.aux):
            # No epilog input or output fixes D's layout here, and nvmath lays D out like A:
            # plan y = x @ W.T (A = x, row-major) so that y comes out row-major.
            res = self._matmul("forward", None if spec.name == "DEFAULT" else spec.name,
                               x, w.T, {})
            if res is None:
                return self._linear_unfused(x, w, bias, spec)
            return self._contig("y", res[0]), None
        inputs = {"bias": self._prep_bias(bias)} if spec.bias else {}
        res = self._matmul("forward", spec.name, w, x.T, inputs)
        if res is None:
            return self._linear_unfused(x, w, bias, spec)
        d, auxd = res
        y = self._contig("y", d.T)
        aux = None
        if spec.aux:
            aux = auxd[f"{spec.activation}_aux"]
            if spec.activation == "gelu" and aux.shape[0] != out:
                aux = aux[:out]  # (F, batch) view of the (round_up(F, 8), batch) buffer
        return y, aux

    @property
    def fp32_wgmma_in_effect(self) -> str:
        """The split full-float32 products run with (``fp32_wgmma``), or "off" where the
        setting, TF32 or a GPU other than compute capability 9.0 keeps the kernel off."""
        if self.fp32_wgmma == "off" or self.tf32 or not W.available():
            return "off"
        return self.fp32_wgmma

    def _wgmma_product(self, a, b, sliced=True):
        """``a @ b`` for float32 views ``a`` (M, K), ``b`` (K, N) by the 3xTF32 wgmma kernel
        (see ``fp32_wgmma``): the (S, M, N) partial products of its S K slices, or None where
        it does not run. S: ``_cuda_wgmma.slices_for`` where ``k_splits`` is "auto", else
        ``k_splits`` (0 or 1: one). ``sliced=False`` (no pass adds the slices): None where
        the product would want more than one, so that cuBLASLt splits K there instead."""
        split = self.fp32_wgmma_in_effect
        if split == "off":
            return None
        lay = W.layout(a, b)  # (dtypes: ``supported`` checks them)
        if lay is None or not W.supported(*lay, a, b):
            return None
        m, n, k, a_kmajor, lda, b_kmajor, ldb = lay
        slices = W.slices_for(m, n, k) if self.k_splits == "auto" else \
            max(1, int(self.k_splits))
        if slices > 1:
            if not sliced:
                return None
            self._counters["k_split"] += 1
        out = cupy.empty((slices, m, n), dtype=np.float32)
        W.product(a, b, out, m, n, k, lda, ldb, a_kmajor=a_kmajor, b_kmajor=b_kmajor,
                  slices=slices, split=split)
        self._counters["wgmma"] += 1
        return out

    def _split_k(self, stage, a, b):
        """``a @ b`` as the (S, M, N) partial products of its K slices (one strided-batched
        matmul; see ``k_splits``; or the 3xTF32 wgmma kernel, see ``fp32_wgmma``), or None
        where it is not split."""
        part = self._wgmma_product(a, b)
        if part is not None:
            return part
        k = a.shape[1]
        splits = 0 if is_half(a.dtype) else \
            _k_split.k_slices(a.shape[0], b.shape[1], k, self.k_splits)
        if not splits:
            return None
        ks = k // splits
        a3 = cupy.lib.stride_tricks.as_strided(
            a, (splits, a.shape[0], ks), (ks * a.strides[1], a.strides[0], a.strides[1]))
        b3 = cupy.lib.stride_tricks.as_strided(
            b, (splits, ks, b.shape[1]), (ks * b.strides[0], b.strides[0], b.strides[1]))
        part, _ = self._matmul(stage + "/split", None, a3, b3, {})
        self._counters["k_split"] += 1
        return self._contig("partials", part)

    @staticmethod
    def _epilog_target(part):
        """``(out, partials)`` for an epilog pass over the (S, M, N) K-slice products
        ``part``: a fresh (M, N) output that the pass writes from their sum, or, for one
        slice, that slice itself, which the pass rewrites in place (the same bits; at batch
        8192 it saves a 134 MB plane of the 784-4096-4096-10 step)."""
        if part.shape[0] == 1:
            return part[0], None
        return cupy.empty(part.shape[1:], dtype=part.dtype), part

    def _linear_unfused(self, x, w, bias, spec):
        if bias is not None:
            bias = cupy.ascontiguousarray(bias)
        own = E.vectorizable(w.shape[0], bias)
        # The product: K-slice partials that the epilog adds up, or one plain matmul.
        part = self._split_k("forward", x, w.T) if own else None
        if part is not None:
            pre, part = self._epilog_target(part)
        else:
            pre, _ = self._matmul("forward", None, x, w.T, {})
            pre = self._contig("y", pre)
        if own and E.vectorizable(pre.shape[1], pre):
            self._counters["own_epilog"] += 1
            if spec.activation == "gelu":
                return E.bias_gelu(pre, bias, aux=spec.aux, partials=part)
            return E.bias_relu(pre, bias, relu=spec.activation == "relu",
                               aux_rows=relu_aux_rows(w.shape[0]) if spec.aux else None,
                               partials=part)
        if spec.activation == "relu":
            if spec.aux:
                return K.relu_pack(pre, bias, relu_aux_rows(w.shape[0]))
            if bias is not None:
                pre += bias
            return K.relu(pre), None
        if bias is not None:
            pre += bias
        if spec.activation == "gelu":
            return K.gelu(pre), (pre.T if spec.aux else None)
        return pre, None

    def _linear_dgrad(self, dy, w, spec, aux):
        out = self._linear_dgrad_impl(dy, w, spec, aux)
        self.params_read()  # the last read of w: an early update of w waits for it
        return out

    def _linear_dgrad_impl(self, dy, w, spec, aux):
        op = f"linear_dgrad/{spec.name}"
        self._check_device(op, dy=dy, w=w, aux=aux)
        self._check_dtype(op, dy.dtype)
        dy, w = self._contig("dy", dy), self._contig("w", w)
        def outputs():
            o = [("dx", (dy.shape[0], w.shape[1]), dy.dtype)]
            return o + ([("dbias", (w.shape[1],), dy.dtype)] if spec.bias else [])

        return self._guard(op, lambda: self._dgrad_impl(dy, w, spec, aux),
                           {"dy": dy, "w": w, "aux": aux}, outputs)

    def _dgrad_impl(self, dy, w, spec, aux):
        batch, features = dy.shape[0], w.shape[1]
        if spec.activation in (None, "relu") and self._skinny_tc(
                "dgrad", w.shape[0], TC.grad_supported(dy, w)):
            aux, ld = self._aux_for_kernels(aux, batch, spec.activation)
            return TC.dgrad(dy, w, aux, ld, bgrad=spec.bias)
        if self._skinny("dgrad", w.shape[0], spec.activation):
            aux, ld = self._aux_for_kernels(aux, batch, spec.activation)
            return S.dgrad(dy, w, aux, ld, bgrad=spec.bias)
        if spec.activation in (None, "relu") and self._own_gemm(dy.dtype) and \
                G.dgrad_supported(dy, w, self.own_gemm_max_macs):
            self._counters["own_gemm"] += 1
            aux, ld = self._aux_for_kernels(aux, batch, spec.activation)
            return G.dgrad(dy, w, aux, ld, bgrad=spec.bias, mma=self.own_gemm_mma)
        if spec.activation and \
                self._own_epilog(dy.dtype, spec, batch, features, batch * features * w.shape[0]):
            return self._dgrad_unfused(dy, w, spec, aux)
        if spec.activation:
            if w.shape[0] == 1:  # K == 1: cuBLASLt refuses DRELU/DGELU
                self._fallbacks[f"dgrad/{spec.name}: K == 1"] += 1
                return self._dgrad_unfused(dy, w, spec, aux)
            if spec.bias and batch * features * w.shape[0] >= self.split_bias_grad_macs:
                self._counters["split_bias_grad"] += 1
                plain = DGRAD_EPILOGS[spec.name[: -len("_BGRAD")]]
                dx, _ = self._dgrad_impl(dy, w, plain, aux)
                return dx, self._sum_rows(dx)
            if spec.activation == "relu":
                cub_aux = self._relu_aux_for_cublas(aux, relu_aux_rows(features), batch)
            else:
                cub_aux = self._gelu_aux_for_cublas(aux, features, batch)
            res = self._matmul("dgrad", spec.name, w.T, dy.T,
                               {f"{spec.activation}_aux": cub_aux})
            if res is None:
                return self._dgrad_unfused(dy, w, spec, aux)
            d, auxd = res
            dx = self._contig("dx", d.T)
            return dx, (auxd[spec.name.lower()] if spec.bias else None)
        return self._plain_dgrad(dy, w), None

    def _plain_dgrad(self, dy, w):
        """``dy @ w`` (row-major) as one cuBLASLt matmul without epilog, in the operand
        orientation of ``dgrad_orientation``."""
        if self.dgrad_orientation == "tt":
            d, _ = self._matmul("dgrad", None, dy, w, {})
            return self._contig("dx", d)
        d, _ = self._matmul("dgrad", None, w.T, dy.T, {})
        return self._contig("dx", d.T)

    def _aux_for_kernels(self, aux, batch, activation):
        """``(aux, ld)`` for fuseflow's own kernels: the column-major relu_aux or gelu_aux
        (copied when its columns are not evenly spaced or it is not aligned to its element)
        and its column stride; ``(None, 0)`` without an activation."""
        if activation is None:
            return None, 0
        ld = self._aux_ld(aux, aux.shape[0], batch)
        if ld is None or aux.data.ptr % aux.itemsize:
            self._copies[f"{activation}_aux"] += 1
            aux, ld = cupy.asfortranarray(aux), aux.shape[0]
        return aux, ld

    def _dgrad_unfused(self, dy, w, spec, aux):
        ld = self._aux_ld(aux, aux.shape[0], dy.shape[0]) if spec.activation else None
        own = ld is not None and E.vectorizable(w.shape[1]) and \
            (spec.activation == "relu" or E.gelu_aux_vectorizable(aux, ld))
        # The product: K-slice partials that the epilog adds up, or one plain matmul.
        part = self._split_k("dgrad", dy, w) if own else None
        if part is not None:
            dx, part = self._epilog_target(part)
        else:
            dx = self._plain_dgrad(dy, w)
        if own and E.vectorizable(dx.shape[1], dx):
            self._counters["own_epilog"] += 1
            grad = E.dgelu if spec.activation == "gelu" else E.drelu
            return grad(dx, aux, ld, bgrad=spec.bias, partials=part)
        dx = self._activation_grad(dx, spec.activation, aux)
        return dx, (self._sum_rows(dx) if spec.bias else None)

    @property
    def fuses_grads(self) -> bool:
        """``linear_grads`` may take the one tensor-core pass (see ``fused_skinny_grads``)."""
        return self.fused_skinny_grads and self.skinny_tc

    def _linear_grads(self, dy, x, w, wspec, dspec, aux, overlap):
        """Both gradients from one tensor-core pass (``_cuda_skinny_tc.grads``) where each
        would be its tensor-core skinny kernel and no side stream takes the weight
        gradient; else None (see base), having copied and counted nothing."""
        n = w.shape[0]
        if not (is_half(dy.dtype) and dspec.activation in (None, "relu")
                and self._takes_skinny_tc("wgrad", n) and self._takes_skinny_tc("dgrad", n)):
            return None
        op = f"linear_grads/{wspec.name}+{dspec.name}"
        self._check_device(op, dy=dy, x=x, w=w, aux=aux)
        if not (dy.flags.c_contiguous and x.flags.c_contiguous and w.flags.c_contiguous
                and TC.grad_supported(dy, x) and TC.grad_supported(dy, w)
                and not (overlap and self._wgrad_scope(dy, x) is not None)):
            return None  # (non-contiguous operands: the two calls copy them, as before)
        batch, features = x.shape

        def outputs():
            o = [("dw", (n, features), dy.dtype), ("dx", (batch, features), dy.dtype)]
            return o + ([("dbias", (features,), dy.dtype)] if dspec.bias else [])

        def run():
            aux_k, ld = self._aux_for_kernels(aux, batch, dspec.activation)
            self._counters["skinny_tc"] += 2  # the two kernels' work, in one launch
            self._counters["fused_skinny_grads"] += 1
            return TC.grads(dy, x, w, aux_k, ld, bgrad_w=wspec.bias, bgrad_x=dspec.bias)

        out = self._guard(op, run, {"dy": dy, "x": x, "w": w}, outputs)
        self.params_read()  # the last read of w, as in _linear_dgrad
        return out

    def _linear_wgrad(self, dy, x, spec, scope=None):
        """``scope``: an open OverlapScope to run on the side stream of (overlapped)."""
        op = f"linear_wgrad/{spec.name}"
        self._check_device(op, dy=dy, x=x)
        self._check_dtype(op, dy.dtype)
        dy, x = self._contig("dy", dy), self._contig("x", x)
        def outputs():
            return [("dw", (dy.shape[1], x.shape[1]), dy.dtype)]

        def run():
            if scope is None:
                return self._wgrad_impl(dy, x, spec)
            with scope.fork(dy, x):  # the side stream, current inside
                self._counters["overlapped_wgrad"] += 1
                stage = "wgrad/side" + (str(scope.last_side) if scope.last_side else "")
                dw, db = self._wgrad_impl(dy, x, spec, stage=stage)
                scope.made(dw, db)
                return dw, db

        return self._guard(op, run, {"dy": dy, "x": x}, outputs)

    @contextlib.contextmanager
    def overlapping_wgrad(self, update_early=False):
        """See ``Backend.overlapping_wgrad``: overlapped weight gradients run on the current
        stream's side stream; the exit makes the current stream wait for them. Nested scopes
        each join their own. ``update_early`` (and ``split_update``, overlap order "after"
        or "early"): the optimizer update right after may start on the side stream
        (``_cuda_overlap.SplitPoint``, taken by ``take_update_split``)."""
        early = update_early and self.split_update and self.overlap_order in ("after", "early")
        scope = (_cuda_overlap.OverlapScope(early, self.overlap_streams) if self.overlap_wgrad
                 else None)
        previous = getattr(self._local, "overlap", None)
        self._local.overlap = scope
        self._local.split = None
        try:
            yield
        finally:
            self._local.overlap = previous
            if scope is not None:
                scope.join()
                self._local.split = scope.split

    def params_read(self):
        """See ``Backend.params_read``: an early update (``take_update_split``) waits for the
        current stream's work so far."""
        scope = getattr(self._local, "overlap", None)
        if scope is not None:
            scope.main_read()

    def take_update_split(self, grads, usable=True):
        """``(split, early)`` for an optimizer update of ``grads`` issued right after an
        ``update_early`` scope's join, where it may start on the side stream (``early``:
        per leaf, whether the side stream made its gradient); else None, and always None
        when not ``usable``. One use: the scope's SplitPoint is dropped either way."""
        split, self._local.split = getattr(self._local, "split", None), None
        if split is None or not usable or not split.ready():
            return None
        early = [split.early(g) for g in grads]
        if all(early) or not any(early):
            return None
        if self.split_update == "auto" and \
                sum(g.size for g, e in zip(grads, early) if e) < self.split_update_min_elements:
            return None
        self._counters["split_update"] += 1
        return split, early

    def release_update_split(self, split) -> bool:
        """``split.release()`` (before the side stream's update), counted in
        ``stats()["split_update_overlapped"]`` where the launches may overlap."""
        overlapped = split.release()
        self._counters["split_update_overlapped"] += overlapped
        return overlapped

    def _overlap_scope(self, dtype, nbytes):
        """The open OverlapScope that side work on ``nbytes`` of kept inputs may fork to, or
        None: "auto" overlaps full float32 only, up to ``overlap_max_bytes``."""
        scope = getattr(self._local, "overlap", None)
        if self.overlap_wgrad == "auto" and not (dtype == np.float32 and not self.tf32 and
                                                 nbytes <= self.overlap_max_bytes):
            return None
        return scope

    def _wgrad_scope(self, dy, x):
        """The scope a weight gradient of ``dy`` and ``x`` (both kept) may fork to, or None."""
        return self._overlap_scope(dy.dtype, dy.nbytes + x.nbytes)

    def wgrad_after_dgrad(self, dy, x) -> bool:
        return self.overlap_order == "after" and self._wgrad_scope(dy, x) is not None

    def lowest_wgrad_on_main(self, dy, x) -> bool:
        return self.overlap_order in ("after", "early") and self._wgrad_scope(dy, x) is not None

    def _linear_wgrad_overlapped(self, dy, x, spec):
        return self._linear_wgrad(dy, x, spec, self._wgrad_scope(dy, x))

    def _wgrad_impl(self, dy, x, spec, stage="wgrad"):
        """``stage`` names the plan-cache entries: a plan's cuBLASLt workspace must not be
        used by two streams at once, so weight gradients on a side stream ("wgrad/side")
        never share a plan with those on the main stream."""
        if self._skinny_tc("wgrad", dy.shape[1], TC.grad_supported(dy, x)):
            return TC.wgrad(dy, x, bgrad=spec.bias)
        if self._skinny("wgrad", dy.shape[1], None):
            return S.wgrad(dy, x, bgrad=spec.bias)
        if not spec.bias and self._own_gemm(dy.dtype) and \
                G.wgrad_supported(dy, x, self.own_gemm_max_macs):
            self._counters["own_gemm"] += 1
            return G.wgrad(dy, x, mma=self.own_gemm_mma), None
        dw = self._wgmma_product(dy.T, x, sliced=False)
        if dw is not None:
            return dw[0], (self._sum_rows(dy) if spec.bias else None)
        if spec.bias:
            res = self._matmul(stage, "BGRADB", x.T, dy, {})
            if res is not None:
                d, auxd = res
                return self._contig("dw", d.T), auxd["bgradb"]
        d, _ = self._matmul(stage, None, x.T, dy, {})
        return self._contig("dw", d.T), (self._sum_rows(dy) if spec.bias else None)

    # ---- activations -----------------------------------------------------------------------
    def _activation(self, x, activation, want_aux):
        op = f"activation/{activation}"
        self._check_device(op, x=x)
        self._check_dtype(op, x.dtype)
        x = self._contig("x", x)

        def run():
            if activation == "relu":
                if want_aux:
                    return K.relu_pack(x, None, relu_aux_rows(x.shape[1]))
                return K.relu(x), None
            return K.gelu(x), (x.T if want_aux else None)

        return self._guard(op, run, {"x": x}, lambda: [("y", x.shape, x.dtype)])

    def _activation_grad(self, dy, activation, aux):
        op = f"activation_grad/{activation}"
        self._check_device(op, dy=dy, aux=aux)
        self._check_dtype(op, dy.dtype)
        dy = self._contig("dy", dy)
        aux, ld = self._aux_for_kernels(aux, dy.shape[0], activation)
        kern = K.relu_grad if activation == "relu" else K.gelu_grad
        return self._guard(op, lambda: kern(dy, aux, ld), {"dy": dy},
                           lambda: [("dx", dy.shape, dy.dtype)])

    def _softmax_cross_entropy(self, logits, labels, grad_scale=None, grad_dtype=None):
        """Value and gradient in one kernel launch (``_cuda_fused.softmax_xent``), the loss
        scaling and the gradient's cast included where asked for."""
        from fuseflow.backend._cuda_fused import softmax_xent

        self._check_device("softmax_cross_entropy", logits=logits, labels=labels)
        if grad_scale is None and grad_dtype is None:
            return softmax_xent(logits, labels)
        if logits.dtype == cupy.float64 or not (
                grad_scale is None or (isinstance(grad_scale, cupy.ndarray)
                                       and grad_scale.dtype == cupy.float32)):
            return super()._softmax_cross_entropy(logits, labels, grad_scale, grad_dtype)
        # 16-bit logits are reduced in float32 either way: the gradient is then the one of
        # their float32 copy (the kernel's accumulators), scaled and cast once
        return softmax_xent(logits, labels, grad_scale,
                            grad_dtype or (cupy.float32 if is_half(logits.dtype)
                                           else logits.dtype))

    def _linear_softmax_xent(self, x, w, bias, labels, dspec, aux, grad_scale, grad_dtype):
        """The one-kernel head (``_cuda_head``) where it applies, else None (see base)."""
        op = "linear_softmax_xent"
        self._check_device(op, x=x, w=w, bias=bias, labels=labels, aux=aux)
        self._check_dtype(op, x.dtype)
        n = w.shape[0]
        dtype = np.dtype(x.dtype)
        if not (self.fused_head and _grad_in_logits_dtype(dtype, grad_scale, grad_dtype)
                and n <= self.skinny_max
                and {"forward", "dgrad"} <= self.skinny_ops and H.supported(x, w, labels)):
            return None
        x, w, labels = self._contig("x", x), self._contig("w", w), self._contig("labels", labels)
        batch, features = x.shape

        def outputs():
            return [("y", (batch, n), dtype), ("dy", (batch, n), dtype)] + \
                ([("dx", (batch, features), dtype)] if dspec is not None else [])

        def run():
            activation = dspec.activation if dspec is not None else None
            aux_k, ld = self._aux_for_kernels(aux, batch, activation)
            loss, y, dy, dx, db, colpart = H.forward_loss_dgrad(
                x, w, self._prep_bias(bias) if bias is not None else None, labels, grad_scale,
                aux_k, ld, dgrad=dspec is not None, bgrad=dspec is not None and dspec.bias,
                activation=activation)
            if colpart is not None:  # the bias gradient's column sums: nothing waits on them
                scope = self._overlap_scope(dtype, colpart.nbytes)
                with scope.fork(colpart) if scope is not None else contextlib.nullcontext():
                    H.sum_partials(colpart, db)
                    if scope is not None:
                        scope.made(db)
            self._counters["fused_head"] += 1
            return loss, y, dy, dx, db

        return self._guard(op, run, {"x": x, "w": w, "bias": bias}, outputs)

    @property
    def fuses_xent(self) -> bool:
        """``linear_xent`` may take the tensor-core forward with the loss (``fused_tc_xent``)."""
        return self.fused_tc_xent and self.skinny_tc

    def _linear_xent(self, x, w, bias, labels, grad_scale, grad_dtype):
        """The tensor-core forward with the loss in one kernel (``_cuda_skinny_tc.
        forward_xent``) where the forward would be the tensor-core kernel, else None (see
        base). The loss gradient comes out in the logits' 16-bit dtype."""
        op = "linear_xent"
        self._check_device(op, x=x, w=w, bias=bias, labels=labels)
        self._check_dtype(op, x.dtype)
        if not (_grad_in_logits_dtype(np.dtype(x.dtype), grad_scale, grad_dtype)
                and TC.xent_supported(x, labels) and x.flags.c_contiguous and w.flags.c_contiguous
                and not self._takes_skinny_forward(x, w.shape[0], None)  # as linear would
                and self._takes_skinny_tc("forward", w.shape[0],
                                          TC.forward_supported(x, w, bias, None))):
            return None
        labels = self._contig("labels", labels)
        batch, n = x.shape[0], w.shape[0]

        def outputs():
            return [("y", (batch, n), x.dtype), ("dy", (batch, n), x.dtype)]

        def run():
            self._counters["skinny_tc"] += 1
            self._counters["fused_tc_xent"] += 1
            return TC.forward_xent(x, w, self._prep_bias(bias) if bias is not None else None,
                                   labels, grad_scale)

        return self._guard(op, run, {"x": x, "w": w, "bias": bias}, outputs)

    @property
    def fuses_xent_grads(self) -> bool:
        """``linear_xent_grads`` may take the one cluster pass (``fused_tc_head``)."""
        return self.fused_tc_head and self.skinny_tc

    def _linear_xent_grads(self, x, w, bias, labels, dspec, aux, grad_scale, grad_dtype,
                           overlap):
        """The output layer's logits, loss and both gradients from one ``_cuda_tc_head``
        launch where its forward, weight and input gradients would each be a tensor-core
        skinny kernel and no side stream takes the weight gradient; else None (see base),
        having copied and counted nothing."""
        op = "linear_xent_grads"
        self._check_device(op, x=x, w=w, bias=bias, labels=labels, aux=aux)
        self._check_dtype(op, x.dtype)
        n, dtype = w.shape[0], np.dtype(x.dtype)
        if not (dspec.activation in (None, "relu")
                and _grad_in_logits_dtype(dtype, grad_scale, grad_dtype)
                and HD.supported(x, w, labels)
                and not self._takes_skinny_forward(x, n, None)  # as linear would
                and all(self._takes_skinny_tc(o, n) for o in ("forward", "wgrad", "dgrad"))
                and not (overlap and self._overlap_scope(dtype, 2 * x.nbytes) is not None)):
            return None
        labels = self._contig("labels", labels)
        batch, features = x.shape

        def outputs():
            return [("y", (batch, n), dtype), ("dx", (batch, features), dtype),
                    ("dw", (n, features), dtype)]

        def run():
            aux_k, ld = self._aux_for_kernels(aux, batch, dspec.activation)
            self._counters["skinny_tc"] += 3  # the three kernels' work, in one launch
            self._counters["fused_tc_head"] += 1
            return HD.forward_grads(x, w, self._prep_bias(bias) if bias is not None else None,
                                    labels, grad_scale, aux_k, ld, bgrad_w=bias is not None,
                                    bgrad_x=dspec.bias)

        out = self._guard(op, run, {"x": x, "w": w, "bias": bias}, outputs)
        self.params_read()  # the last read of w, as in _linear_dgrad
        return out

    def _sum_rows(self, a):
        self._check_device("bias_grad", a=a)
        self._check_dtype("bias_grad", a.dtype)
        if a.ndim != 2:
            raise BackendError(f"bias_grad needs a 2-D (batch, features) array, got {a.shape}")
        a = self._contig("dy", a)
        return self._guard("bias_grad", lambda: K.sum_rows(a), {"a": a},
                           lambda: [("dbias", (a.shape[1],), a.dtype)])
