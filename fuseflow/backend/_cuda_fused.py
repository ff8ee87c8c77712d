"""Fused CUDA kernels for the compiled training step: few launches, not one per tensor.

- ``softmax_xent``: softmax cross-entropy value AND gradient in one launch up to 1024 rows
  (one block reduces the loss in shared memory); longer batches use one block per 256 rows
  and a second one-block launch that adds the blocks' partial sums in a fixed order.
- ``multi_tensor_update``: an optimizer update of ALL parameter tensors in one launch. The
  kernel is generated for the exact list of tensor sizes (cached), each tensor's pointers
  passed as arguments; every thread finds its tensor from the compile-time offsets. It can
  write in place (inside a compiled step, where params/state are donated buffers) or into
  fresh arrays (eager, keeping the step pure).
- ``multi_tensor_cast``, ``multi_tensor_all_finite`` and ``next_loss_scale``: mixed
  precision's casts (optionally unscaling), its finiteness check over every gradient, and
  the loss-scale rule, one launch each.

The arithmetic repeats the reference optimizers' (``fuseflow.optim``) operation by
operation, in the leaf dtype with the same float32 constants, so both paths agree to
rounding.
"""

from __future__ import annotations

import functools

import cupy
import numpy as np

from fuseflow._dtypes import HALF, accumulation, bfloat16
from fuseflow.backend._env import env_int

#: The C type of each dtype in the generated kernels (every kernel module's, through this),
#: and the headers that declare the 16-bit ones.
_CTYPES = {np.dtype(np.float16): "__half", bfloat16: "__nv_bfloat16",
           np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
HALF_HEADERS = "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"


def acc_ctype(dtype) -> str:
    """The C type a kernel sums ``dtype`` values in (``_dtypes.accumulation``)."""
    return _CTYPES[accumulation(dtype)]

#: ``ff_cast<D>(s)``: ``(D)(s)``, but exact where CuPy's -ftz=true (which it always passes
#: to NVRTC) would flush a subnormal: there ``(double)`` of a float32 compiles to
#: ``cvt.ftz.f64.f32`` and ``(float)`` of a float64 to ``cvt.rn.ftz.f32.f64``, so those two
#: (and bfloat16 to float64, through float32) are written without ``.ftz``. For the kernels
#: that cast (``multi_tensor_cast``, the compiled step's batch copy).
EXACT_CASTS = HALF_HEADERS + r"""
template <typename D, typename S> __device__ __forceinline__ D ff_cast(S s) { return (D)(s); }
template <> __device__ __forceinline__ double ff_cast<double, float>(float f) {
    double d;
    asm("cvt.f64.f32 %0, %1;" : "=d"(d) : "f"(f));
    return d;
}
template <> __device__ __forceinline__ float ff_cast<float, double>(double d) {
    float f;
    asm("cvt.rn.f32.f64 %0, %1;" : "=f"(f) : "d"(d));
    return f;
}
template <> __device__ __forceinline__ double ff_cast<double, __nv_bfloat16>(__nv_bfloat16 h) {
    return ff_cast<double>((float)h);  // (float) of a bfloat16 is exact (cvt.f32.bf16)
}
"""
HALF_CTYPES = frozenset(_CTYPES[d] for d in HALF)
_LABEL_CTYPES = {np.dtype(np.int64): "long long", np.dtype(np.int32): "int",
                 np.dtype(np.int16): "short", np.dtype(np.int8): "signed char",
                 np.dtype(np.uint64): "unsigned long long", np.dtype(np.uint32): "unsigned int",
                 np.dtype(np.uint16): "unsigned short", np.dtype(np.uint8): "unsigned char"}

#: The loss gradient times the loss scale, rounded once (never contracted into an FMA);
#: shared with ``_cuda_head``'s fused output layer.
MUL_RN_SRC = r"""
#define FULL 0xffffffffu
// the gradient times the loss scale, rounded once (never contracted into an FMA)
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
"""


def row_softmax_src(acc: str, n: str, label: str, indent: int) -> str:
    """A row's softmax over its logits ``e[n]`` (type ``acc``) with its ``label``: the
    largest logit ``m``, ``e[j]`` made ``exp(e[j] - m)`` in place, their sum ``s`` and the
    label's logit ``zy``. The one text of this arithmetic: the xent kernel and the fused
    output layers (``_cuda_head``, ``_cuda_tc_head``) agree bit for bit because they share it.
    """
    pad = " " * indent
    lines = (f"{acc} m = e[0];", "#pragma unroll",
             f"for (int j = 1; j < {n}; ++j) m = max(m, e[j]);",
             f"{acc} s = 0, zy = 0;", "#pragma unroll",
             f"for (int j = 0; j < {n}; ++j) {{", f"    if (j == {label}) zy = e[j];",
             "    e[j] = exp(e[j] - m);", "    s += e[j];", "}")
    return "".join(f"{pad}{line}\n" for line in lines)


# One thread per row. With a class count C known at compile time (up to MAX_STATIC_CLASSES)
# the row's exponentials stay in registers (computed once, not twice); the block's loss sum
# is a warp-shuffle reduction plus one pass over the warps' sums (one barrier, not log2(n)).
_XENT = MUL_RN_SRC + r"""#define GRAD(x) ((D)(gscale ? mul_rn((ACC)(x), (ACC)gscale[0]) : (ACC)(x)))
__device__ __forceinline__ ACC warp_sum(ACC v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

extern "C" __global__ void __launch_bounds__(XENT_THREADS) xent(const T* logits,
                                const L* labels, int n, int c,
                                D* dlogits, ACC* loss, const float* gscale) {
    __shared__ ACC partial[32];
    ACC acc = 0;
    const ACC inv_n = (ACC)1 / (ACC)n;
    const int stride = gridDim.x == 1 ? blockDim.x : n;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const T* z = logits + (long long)i * c;
        D* d = dlogits + (long long)i * c;
        const int y = (int)labels[i];
#if C > 0
        ACC e[C];
        #pragma unroll
        for (int j = 0; j < C; ++j) e[j] = (ACC)z[j];
""" + row_softmax_src("ACC", "C", "y", 8) + r"""        acc += log(s) - (zy - m);
        const ACC r = (ACC)1 / s;
        #pragma unroll
        for (int j = 0; j < C; ++j)
            d[j] = GRAD((e[j] * r - (j == y ? (ACC)1 : (ACC)0)) * inv_n);
#else
        ACC m = (ACC)z[0];
        for (int j = 1; j < c; ++j) m = max(m, (ACC)z[j]);
        ACC s = 0;
        for (int j = 0; j < c; ++j) s += exp((ACC)z[j] - m);
        acc += log(s) - ((ACC)z[y] - m);
        for (int j = 0; j < c; ++j)
            d[j] = GRAD((exp((ACC)z[j] - m) / s - (j == y ? (ACC)1 : (ACC)0)) * inv_n);
#endif
    }
    acc = warp_sum(acc);  // blockDim.x is a multiple of 32 (the host launches 32 to 256)
    const int warps = blockDim.x / 32;
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x >= 32) return;
    acc = warp_sum(threadIdx.x < warps ? partial[threadIdx.x] : (ACC)0);
    // one block: the mean; several: this block's sum, added up by xent_sum
    if (threadIdx.x == 0) loss[blockIdx.x] = gridDim.x == 1 ? acc * inv_n : acc;
}

extern "C" __global__ void xent_sum(const ACC* partial, int blocks, int n, ACC* loss) {
    if (threadIdx.x != 0) return;
    ACC s = 0;
    for (int b = 0; b < blocks; ++b) s += partial[b];
    loss[0] = s / (ACC)n;
}
"""

#: Class counts compiled into the loss kernel (registers for the row); more use the loop.
MAX_STATIC_CLASSES = 32
#: Threads of a loss block: one block (looping over the rows) up to 1024 rows, 256-row
#: blocks past that. (1024 threads of 32 float64 registers each do not fit an SM.)
XENT_THREADS = 256


@functools.cache
def _xent_kernel(dtype, label_dtype, classes=0, grad_dtype=None):
    acc = acc_ctype(dtype)
    head = (f"{HALF_HEADERS}typedef {_CTYPES[dtype]} T; "
            f"typedef {_CTYPES[grad_dtype or dtype]} D; "
            f"typedef {_LABEL_CTYPES[label_dtype]} L; typedef {acc} ACC;\n"
            f"#define C {classes if classes <= MAX_STATIC_CLASSES else 0}\n"
            f"#define XENT_THREADS {XENT_THREADS}\n")
    module = cupy.RawModule(code=head + _XENT)
    return module.get_function("xent"), module.get_function("xent_sum")


def softmax_xent(logits, labels, grad_scale=None, grad_dtype=None):
    """``(mean loss, dlogits)`` of softmax cross-entropy in one kernel launch.

    ``grad_scale`` (a 0-d float32 device array) and ``grad_dtype``: dlogits comes back as
    ``(dlogits * grad_scale).astype(grad_dtype)``, the product rounded once in the
    accumulation precision (mixed precision's scaled 16-bit loss gradient, formed here
    instead of by two more launches)."""
    n, c = logits.shape
    logits = cupy.ascontiguousarray(logits)
    labels = cupy.ascontiguousarray(labels)
    acc = cupy.float64 if logits.dtype == cupy.float64 else cupy.float32
    grad_dtype = np.dtype(grad_dtype or logits.dtype)
    dlogits = cupy.empty(logits.shape, dtype=grad_dtype)
    loss = cupy.empty((), dtype=acc)
    xent, xent_sum = _xent_kernel(logits.dtype, labels.dtype,
                                  c if c <= MAX_STATIC_CLASSES else 0,
                                  None if grad_dtype == logits.dtype else grad_dtype)
    gscale = grad_scale if grad_scale is not None else np.uintp(0)
    if n <= 1024:
        threads = min(XENT_THREADS, max(32, 1 << (max(n, 1) - 1).bit_length()))
        xent((1,), (threads,), (logits, labels, np.int32(n), np.int32(c), dlogits, loss,
                                gscale))
    else:
        blocks = -(-n // XENT_THREADS)
        partial = cupy.empty(blocks, dtype=acc)
        xent((blocks,), (XENT_THREADS,),
             (logits, labels, np.int32(n), np.int32(c), dlogits, partial, gscale))
        xent_sum((1,), (32,), (partial, np.int32(blocks), np.int32(n), loss))
    return loss, dlogits


# ---- multi-tensor kernels: one launch over many tensors -------------------------------------
# Each thread handles W consecutive elements of one tensor ("a vector", W = 4 or 8) with
# W-wide loads and stores where every pointer is aligned to W elements (CuPy's allocations
# are); a tensor's last partial vector, or a misaligned tensor, takes the scalar path.
# Tensor k owns vectors [Q_k, Q_k + ceil(n_k / W)) of one flat index space (compile-time
# offsets), which a grid-stride loop walks.
_VEC_HEAD = HALF_HEADERS + r"""template <typename X, int N>
struct alignas(N * sizeof(X)) ffv { X v[N]; };
template <typename X, int N> __device__ __forceinline__ ffv<X, N> ldv(const X* p) {
    return *reinterpret_cast<const ffv<X, N>*>(p);
}
template <typename X, int N> __device__ __forceinline__ void stv(X* p, const ffv<X, N>& x) {
    *reinterpret_cast<ffv<X, N>*>(p) = x;
}
"""

#: Bytes a multi-tensor kernel aims to move per access of its narrowest array: a thread
#: takes ``max(4, VECTOR_BYTES // itemsize)`` elements, so 16-bit arrays (mixed precision's
#: gradients and params) are read 8 at a time, 16 bytes, as float32 ones are 4 at a time.
#: ``FUSEFLOW_VECTOR_BYTES=8``: always 4 elements, the earlier form (for side-by-sides).
VECTOR_BYTES = 16 if env_int("FUSEFLOW_VECTOR_BYTES", 16) >= 16 else 8


def vector_width(*dtypes) -> int:
    """Elements per thread of a multi-tensor kernel over arrays of these dtypes."""
    return max(4, VECTOR_BYTES // min(np.dtype(d).itemsize for d in dtypes))


def _quad_kernel(name, typedefs, args, arrays, element, vector, prologue=""):
    """A grid-stride kernel over the W-element vectors of several tensors.

    ``arrays(k)``: [(pointer name, element type, is_output)] of tensor k. ``element(k)``:
    the statements for one element j (scalar loads/stores included). The vector path loads
    each input as ``ffv``, runs ``element``'s arithmetic on ``<name>_v.v[u]`` (the generator
    rewrites ``ptr[j]`` accesses), and stores the outputs as ``ffv``. ``vector``: the
    tensors' "sizes", whether every pointer is "aligned" to W elements, and "width" W.
    """
    sizes, w = vector["sizes"], vector.get("width", 4)
    branches, q0 = [], 0
    for k, n in enumerate(sizes):
        nq, full = -(-n // w), (n // w if vector["aligned"] else 0)
        arrs = arrays(k)
        loads = " ".join(f"ffv<{t}, {w}> {a}_v = ldv<{t}, {w}>({a} + {w} * q);"
                         for a, t, out in arrs if not out)
        decl = " ".join(f"ffv<{t}, {w}> {a}_v;" for a, t, out in arrs if out)
        body = element(k)
        for a, _, _ in arrs:
            body = body.replace(f"{a}[j]", f"{a}_v.v[u]")
        stores = " ".join(f"stv<{t}, {w}>({a} + {w} * q, {a}_v);" for a, t, out in arrs if out)
        vec = (f"{loads} {decl}\n        #pragma unroll\n        for (int u = 0; u < {w}; ++u) "
               f"{{ {body} }}\n        {stores}")
        scalar = (f"for (long long j = {w} * q; j < {w} * q + {w} && j < {n}LL; ++j) "
                  f"{{ {element(k)} }}")
        branches.append(f"if (i < {q0 + nq}LL) {{ long long q = i - {q0}LL;\n"
                        f"      if (q < {full}LL) {{ {vec} }}\n      else {{ {scalar} }} }}")
        q0 += nq
    src = (_VEC_HEAD + typedefs + f"extern \"C\" __global__ void {name}({', '.join(args)}) {{\n"
           + prologue +
           "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;"
           " i += (long long)gridDim.x * blockDim.x) {\n    "
           + "\n    else ".join(branches) + "\n  }\n}\n")
    return cupy.RawKernel(src, name), q0


def _aligned(arrays, width=4):
    return all(a.data.ptr % (width * a.itemsize) == 0 for a in arrays)


#: grid size cap of the multi-tensor kernels, in blocks of 256 per SM (132 SMs on H100/H200).
#: Uncapped (one quad per thread) measured fastest: the large model's Adam update took
#: 161 us against 167 / 174 / 183 us at 32 / 8 / 4 blocks per SM (benchmarks/kernels.py).
BLOCKS_PER_SM = 2 ** 20


def _launch(kern, quads, args):
    threads = 256
    blocks = max(1, min(-(-quads // threads), 132 * BLOCKS_PER_SM))
    kern((blocks,), (threads,), (np.int64(quads), *args))


# Per element of tensor k: the reference's arithmetic. Names: p g (inputs), m v / t (state),
# and the outputs P M V / T. Scalars: see the kernel arguments.
_BODIES = {
    "sgd": "W P_ = p + g * step;",
    "momentum": "W T_ = g + decay * t; "
                "W u_ = nesterov ? (W)(g + decay * T_) : T_; W P_ = p + u_ * step;",
    "adam": "W M_ = one_minus_b1 * g + b1 * m; W V_ = one_minus_b2 * (g * g) + b2 * v; "
            "W u_ = (M_ / c1) / (sqrt(V_ / c2) + eps); "
            "if (DECAY) u_ = u_ + wd * p; W P_ = p + u_ * step;",
}
_STATE = {"sgd": (), "momentum": ("t",), "adam": ("m", "v")}


@functools.cache
def _multi_tensor_kernel(kind, ctype, wtype, sizes, decays, nesterov, aligned, gtype=None,
                         scaled=False, width=4, ltype=None):
    """``gtype``: the grads' element type when it differs from the params' (16-bit grads of
    float32 params); ``scaled``: each gradient is ``(W)g * grad_scale[0]`` (mixed
    precision's unscaling, folded into the update: the same float32 product); ``ltype``:
    also store each new param cast to this type (mixed precision's compute copy, the cast
    the next step would otherwise make)."""
    states = _STATE[kind]
    args = ["long long total", "const bool* finite_ptr", "const W* step_ptr", "W step_const",
            "const int* count_ptr", "int* new_count_ptr", "int bump", "const int* sched_ptr",
            "int* new_sched_ptr", "const W* table_ptr", "long long table_last",
            "const float* gscale_ptr", "W b1", "W b2",
            "W one_minus_b1", "W one_minus_b2", "W eps", "W wd", "W decay"]
    for k in range(len(sizes)):
        args += [f"const T* p{k}", f"T* P{k}", f"const G* g{k}"]
        for st in states:
            args += [f"const T* {st}{k}", f"T* {st.upper()}{k}"]
        if ltype:
            args += [f"L* L{k}"]

    def arrays(k):
        return ([(f"p{k}", "T", False), (f"g{k}", "G", False)]
                + [(f"{st}{k}", "T", False) for st in states]
                + [(f"P{k}", "T", True)] + [(f"{st.upper()}{k}", "T", True) for st in states]
                + ([(f"L{k}", "L", True)] if ltype else []))

    def element(k):
        # __fmul_rn: never contracted into an FMA with the update's next addition, so the
        # product is rounded as the unscaling cast rounds it (float32 params only)
        grad = f"__fmul_rn((W)g{k}[j], gs)" if scaled else f"(W)g{k}[j]"
        loads = [f"W p = (W)p{k}[j];", f"W g = {grad};"] + \
                [f"W {st} = (W){st}{k}[j];" for st in states]
        body = _BODIES[kind].replace("DECAY", "true" if decays[k] else "false")
        # A skipped step (non-finite gradients under loss scaling) stores the old values.
        stores = [f"{o}{k}[j] = (T)(ok ? {o}_ : {o.lower()});"
                  for o in ["P"] + [st.upper() for st in states]]
        if ltype:  # the stored param, cast: what casting the new params gives
            stores.append(f"L{k}[j] = (L)(T)(ok ? P_ : p);")
        return " ".join(loads + [body] + stores)

    prologue = (f"  const bool nesterov = {'true' if nesterov else 'false'};\n"
                "  const bool ok = finite_ptr ? finite_ptr[0] : true;\n"
                "  W step = step_ptr ? (W)step_ptr[0] : (W)step_const;\n"
                "  if (table_ptr) {  // a schedule's step sizes, flat from table_last on\n"
                "    const long long c = sched_ptr[0];\n"
                "    step = table_ptr[c < 0 ? 0 : (c < table_last ? c : table_last)];\n"
                "  }\n"
                "  // With new_*_ptr, the counters are incremented here (saturating, as\n"
                "  // optim's increment) into separate buffers: every thread reads the old.\n"
                "  // A skipped step (!ok) stores the old counts, as it stores the old values.\n"
                "  const int t_old = count_ptr ? count_ptr[0] : 0;\n"
                "  int t_int = t_old;\n"
                "  if (new_count_ptr || bump) t_int += t_int < 2147483647 ? 1 : 0;\n"
                "  if (blockIdx.x == 0 && threadIdx.x == 0) {\n"
                "    if (new_count_ptr) new_count_ptr[0] = ok ? t_int : t_old;\n"
                "    if (new_sched_ptr) new_sched_ptr[0] = sched_ptr[0]\n"
                "        + (ok && sched_ptr[0] < 2147483647 ? 1 : 0);\n"
                "  }\n"
                "  W t_ = (W)t_int;\n"
                "  W c1 = (W)1 - pow(b1, t_); W c2 = (W)1 - pow(b2, t_);\n"
                "  const W gs = gscale_ptr ? (W)gscale_ptr[0] : (W)1;\n")
    types = f"typedef {ctype} T; typedef {gtype or ctype} G; typedef {wtype} W;\n"
    if ltype:
        types += f"typedef {ltype} L;\n"
    return _quad_kernel("update", types, args, arrays, element,
                        {"sizes": sizes, "aligned": aligned, "width": width}, prologue)


def multi_tensor_update(kind, params, grads, states, *, step=None, step_const=0.0,
                        count=None, b1=0.0, b2=0.0, eps=0.0, wd=0.0, decays=None,
                        decay=0.0, nesterov=False, in_place=False, finite=None,
                        grad_scale=None, new_count=None, sched_count=None,
                        new_sched_count=None, step_table=None, low=None,
                        compile_only=False, bump_count=False):
    """One launch that updates every tensor; returns ``(new_params, new_states)``, and
    ``new_low`` third when ``low`` is given.

    ``states`` is a list (one per state kind: m and v for adam, the trace for momentum) of
    lists of tensors like ``params``. ``step`` is a 0-d float32 device array (or None to use
    ``step_const``); ``count`` a 0-d int32 device array (adam's bias corrections);
    ``finite`` an optional 0-d bool device array: where False, every tensor keeps its value.
    ``grad_scale`` (a 0-d float32 device array or None) multiplies each gradient after its
    cast to the params' precision; the grads may then be of another float dtype.
    ``new_count`` (a 0-d int32 device array): ``count`` is the count before this step, and
    the kernel writes the incremented one there (and uses it). ``step_table``: the step
    sizes of a schedule for counts 0..len-1 (the last one holds from then on), indexed by
    ``sched_count``; the kernel writes ``sched_count + 1`` to ``new_sched_count``. Where
    ``finite`` is False the kernel writes the old counts to both instead (a skipped step).
    ``low``: a lower-precision copy of every param (mixed precision's compute params); the
    kernel also stores each new param cast to it (into ``low`` itself when ``in_place``).
    ``compile_only``: build (and load) the kernel for these tensors, launch nothing.
    ``bump_count``: use ``count + 1`` as ``new_count`` would, without storing it (the second
    launch of a split update, whose partner stores the counters).
    """
    dtype = params[0].dtype
    wnp = accumulation(dtype).type  # the update's arithmetic: float32 for 16-bit params
    wtype = acc_ctype(dtype)
    sizes = tuple(int(p.size) for p in params)
    decays = tuple(bool(d) for d in (decays or [False] * len(params)))
    new_params = params if in_place else [cupy.empty_like(p) for p in params]
    new_states = states if in_place else [[cupy.empty_like(s) for s in group] for group in states]
    new_low = None if low is None else low if in_place else [cupy.empty_like(a) for a in low]
    every = [*params, *grads, *new_params, *(a for g in (*states, *new_states) for a in g),
             *(new_low or [])]
    gtype = _CTYPES[grads[0].dtype] if grads[0].dtype != dtype else None
    width = vector_width(dtype, grads[0].dtype, *([low[0].dtype] if low else []))
    kern, quads = _multi_tensor_kernel(kind, _CTYPES[dtype], wtype, sizes, decays,
                                       bool(nesterov), _aligned(every, width), gtype,
                                       grad_scale is not None, width,
                                       _CTYPES[low[0].dtype] if low else None)
    if compile_only:
        kern.compile()
        return None
    args = [finite if finite is not None else np.uintp(0),
            step if step is not None else np.uintp(0),
            wnp(step_const), count if count is not None else np.uintp(0),
            new_count if new_count is not None else np.uintp(0), np.int32(bool(bump_count)),
            sched_count if sched_count is not None else np.uintp(0),
            new_sched_count if new_sched_count is not None else np.uintp(0),
            step_table if step_table is not None else np.uintp(0),
            np.int64(step_table.size - 1 if step_table is not None else 0),
            grad_scale if grad_scale is not None else np.uintp(0),
            wnp(b1), wnp(b2), wnp(1 - b1), wnp(1 - b2), wnp(eps), wnp(wd), wnp(decay)]
    for k in range(len(params)):
        args += [params[k], new_params[k], grads[k]]
        for group, new_group in zip(states, new_states):
            args += [group[k], new_group[k]]
        if new_low is not None:
            args.append(new_low[k])
    _launch(kern, quads, args)
    return (new_params, new_states) if low is None else (new_params, new_states, new_low)


# ---- multi-tensor casts, finiteness and the loss scale (mixed precision) -------------------
# mixed_precision.dynamic_loss_scaling's rule, operation by operation (float32 products)
_NEXT_LOSS_SCALE = r"""
extern "C" __global__ void next_loss_scale(const bool* finite, const float* scale,
        const int* good, float* new_scale, int* new_good, int interval, float growth,
        float backoff, float min_scale) {
    const bool ok = finite[0];
    const int g = ok ? good[0] + 1 : 0;
    const bool grow = g >= interval;
    const float s = scale[0];
    const float shrunk = s * backoff;
    const float grown = s * growth;
    // as xp.maximum: a NaN scale stays NaN; a growth to inf (or NaN) keeps the scale
    new_scale[0] = ok ? (grow && grown <= 3.402823466e38f ? grown : s)
                      : (shrunk != shrunk || shrunk > min_scale ? shrunk : min_scale);
    new_good[0] = grow ? 0 : g;
}
"""


@functools.cache
def _next_loss_scale_kernel():
    return cupy.RawKernel(_NEXT_LOSS_SCALE, "next_loss_scale")


def next_loss_scale(finite, scale, good_steps, growth_interval, growth_factor, backoff_factor,
                    min_scale):
    """``(scale, good_steps)`` of dynamic loss scaling after one step, as new 0-d arrays."""
    kern = _next_loss_scale_kernel()
    new_scale = cupy.empty((), dtype=cupy.float32)
    new_good = cupy.empty((), dtype=cupy.int32)
    interval = np.int32(min(growth_interval, 2 ** 31 - 1))  # "never grow" stays never
    kern((1,), (1,), (finite, scale, good_steps, new_scale, new_good, interval,
                      np.float32(growth_factor), np.float32(backoff_factor),
                      np.float32(min_scale)))
    return new_scale, new_good


@functools.cache
def _cast_kernel(src_ctype, dst_ctype, sizes, scaled, aligned, width=4):
    args = ["long long total", "const float* scale_ptr"]
    for k in range(len(sizes)):
        args += [f"const S* s{k}", f"D* d{k}"]

    def element(k):
        # a 16-bit source goes through float32 (exactly): CUDA defines no cast from one
        # 16-bit format to the other
        wide = (f"ff_cast<float>(s{k}[j])" if scaled or src_ctype in HALF_CTYPES
                else f"s{k}[j]")
        return f"d{k}[j] = ff_cast<D>({wide}{' * sc' if scaled else ''});"

    return _quad_kernel("cast", f"{EXACT_CASTS}typedef {src_ctype} S; typedef {dst_ctype} D;\n",
                        args,
                        lambda k: [(f"s{k}", "S", False), (f"d{k}", "D", True)], element,
                        {"sizes": sizes, "aligned": aligned, "width": width},
                        "  const float sc = scale_ptr ? scale_ptr[0] : 1.0f;\n")


def multi_tensor_cast(leaves, dtype, scale=None):
    """``[(leaf * scale).astype(dtype) for leaf in leaves]`` in one launch; ``scale`` is a
    0-d float32 device array, applied in float32 after the cast to float32 (as
    ``g.astype(float32) * scale`` does), or None."""
    dtype = np.dtype(dtype)
    sizes = tuple(int(a.size) for a in leaves)
    out = [cupy.empty(a.shape, dtype=dtype) for a in leaves]
    if sum(sizes):
        width = vector_width(leaves[0].dtype, dtype)
        kern, quads = _cast_kernel(_CTYPES[leaves[0].dtype], _CTYPES[dtype], sizes,
                                   scale is not None, _aligned([*leaves, *out], width), width)
        args = [scale if scale is not None else np.uintp(0)]
        for a, o in zip(leaves, out):
            args += [a, o]
        _launch(kern, quads, args)
    return out


@functools.cache
def _finite_kernel(ctype, sizes, aligned, scaled=False, width=4):
    args = ["long long total", "bool* ok", "const float* scale_ptr", "float* inv_out"] + \
        [f"const T* s{k}" for k in range(len(sizes))]
    # scaled: the float32 product of the unscaling (as the update kernel forms it). With
    # inv_out the factor is 1 / scale_ptr[0] (IEEE-rounded with CuPy's -ftz=true, the bits
    # of CuPy's own 1 / scale: a subnormal inverse, of a scale above 2**126, is 0 on both),
    # which the first thread also stores there for the update kernel that follows.
    wtype = "double" if ctype == "double" and not scaled else "float"
    value = "(W)s{k}[j] * sc" if scaled else "(W)s{k}[j]"
    return _quad_kernel("all_finite", f"typedef {ctype} T; typedef {wtype} W;\n", args,
                        lambda k: [(f"s{k}", "T", False)],
                        lambda k: f"if (!isfinite({value.format(k=k)})) ok[0] = false;",
                        {"sizes": sizes, "aligned": aligned, "width": width},
                        "  const float given = scale_ptr ? scale_ptr[0] : 1.0f;\n"
                        "  const float factor = inv_out ? 1.0f / given : given;\n"
                        "  if (inv_out && blockIdx.x == 0 && threadIdx.x == 0)\n"
                        "    inv_out[0] = factor;\n"
                        "  const W sc = scale_ptr ? (W)factor : (W)1;\n")


def multi_tensor_all_finite(leaves, scale=None, inverse_into=None):
    """A 0-d bool device array: every element of every leaf (times ``scale``, a 0-d float32
    device array, in float32, where given) is finite. One launch; the threads that see an
    inf/nan all write the same False. ``inverse_into`` (a 0-d float32 device array, with
    ``scale``): the factor is ``1 / scale`` instead, which the kernel also stores there
    (mixed precision's unscaling factor, formed without a launch of its own)."""
    ok = cupy.ones((), dtype=cupy.bool_)
    sizes = tuple(int(a.size) for a in leaves)
    if not sum(sizes):
        if inverse_into is not None:
            cupy.divide(1.0, scale, out=inverse_into)  # no kernel to store it
        return ok
    width = vector_width(leaves[0].dtype)
    kern, quads = _finite_kernel(_CTYPES[leaves[0].dtype], sizes, _aligned(leaves, width),
                                 scale is not None, width)
    _launch(kern, quads, [ok, scale if scale is not None else np.uintp(0),
                          inverse_into if inverse_into is not None else np.uintp(0), *leaves])
    return ok
