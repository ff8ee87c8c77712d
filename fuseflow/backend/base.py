"""The backend interface: the few array operations whose implementation differs per device.

Everything above ``fuseflow.backend`` (layers, losses, optimizers, the engine) is written
against this interface plus NumPy-style array code on ``backend.xp``. Two implementations:
``NumpyBackend`` (the reference, any CPU, float64-capable) and ``CudaBackend`` (CuPy +
nvmath-python cuBLASLt epilogs).

Orientation. Activations are row-major ``(batch, features)``; dense weights are ``(out, in)``.
In cuBLASLt terms the forward is ``y.T = W @ x.T`` with M = out, N = batch, K = in, whose
column-major ``(out, batch)`` result is the same memory as a row-major ``(batch, out)``
array, and whose per-row bias is the layer's per-feature bias. No activation is copied.

The public methods validate and count; subclasses implement the underscored ones.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import numpy as np

from fuseflow import random
from fuseflow._dtypes import bfloat16, is_half
from fuseflow.backend.epilogs import (ACTIVATIONS, DGRAD_EPILOGS, EPILOGS, WGRAD_EPILOGS,
                                      aux_shape, lookup)


#: DLPack device types whose memory the GPU reads in place (kDLCUDA, kDLCUDAManaged). Pinned
#: host memory (kDLCUDAHost, 3) is CPU memory: it becomes a NumPy array like any other.
DLPACK_GPU_DEVICES = (2, 13)


def from_dlpack(take, x):
    """``take(x)`` (``np.from_dlpack`` or ``cupy.from_dlpack``), with a TypeError that says
    what to do when the array library cannot hold ``x``'s dtype, where DLPack itself only
    says "Unsupported dtype". NumPy's DLPack has no bfloat16: a host bfloat16 array that
    converts itself (JAX's, through ml_dtypes, without a copy) is taken that way."""
    try:
        return take(x)
    except (BufferError, RuntimeError, TypeError, ValueError) as e:
        if take is np.from_dlpack and str(getattr(x, "dtype", "")) == "bfloat16" \
                and hasattr(x, "__array__"):
            try:
                out = np.asarray(x)
            except (RuntimeError, TypeError, ValueError):  # torch's bfloat16 tensors
                out = None
            if out is not None and out.dtype == bfloat16:
                return out
        fix = ("convert it to a float32, float16 or float64 array first, e.g. "
               "x.astype(jnp.float32) (JAX) or x.float() (PyTorch)" if "dtype" in str(e).lower()
               else "pass a tensor that needs no gradient, e.g. x.detach() (PyTorch), or "
               "convert it to NumPy first")
        raise TypeError(f"ff.asarray: cannot take a {type(x).__module__.split('.')[0]} "
                        f"{type(x).__name__} of dtype {getattr(x, 'dtype', '?')} through DLPack "
                        f"({e}). Fix: {fix}.") from None


class BackendError(ValueError):
    """An operand that a backend cannot use (wrong shape, dtype, device or aux)."""


class Backend:
    name = "abstract"
    device = "cpu"
    xp = None
    dtypes = ()
    #: Whether ``linear_grads`` may have a fused form here at all (else it returns None at
    #: once, and the caller's two calls check the operands).
    fuses_grads = False
    #: Whether ``linear_xent`` may have a fused form here at all (else it returns None at
    #: once, and the caller's ``linear`` and ``softmax_cross_entropy`` check the operands).
    fuses_xent = False
    #: Whether ``linear_xent_grads`` may have a fused form here at all (else it returns None
    #: at once, and the caller's other calls check the operands).
    fuses_xent_grads = False

    def __init__(self):
        self.calls = Counter()

    # ---- dense matmuls with epilogs --------------------------------------------------------
    def linear(self, x, w, bias=None, epilog="DEFAULT"):
        """``y = act(x @ w.T + bias)``; returns ``(y, aux)`` (aux None unless the epilog writes it).

        x ``(batch, in)``, w ``(out, in)``, bias ``(out,)``. y is ``(batch, out)``.
        """
        spec = lookup(EPILOGS, epilog, "forward")
        self._check_linear("linear", spec, x, w, bias)
        self.calls["linear/" + spec.name] += 1
        return self._linear(x, w, bias, spec)

    def linear_dgrad(self, dy, w, epilog="DEFAULT", aux=None):
        """Input gradient ``dx = dy @ w``, with the epilog applied to dx.

        With DRELU/DGELU, ``aux`` is the lower layer's relu_aux/gelu_aux (features = w's in)
        and dx comes back already multiplied by that activation's derivative; with _BGRAD
        the row sum of that result (the lower layer's bias gradient) comes back too.
        Returns ``(dx, dbias or None)``. cuBLASLt view: ``dx.T = W.T @ dy.T``.
        """
        spec = self._check_dgrad(dy, w, epilog, aux)
        self.calls["linear_dgrad/" + spec.name] += 1
        return self._linear_dgrad(dy, w, spec, aux)

    def _check_dgrad(self, dy, w, epilog, aux):
        """``linear_dgrad``'s operand checks; returns the epilog's spec."""
        spec = lookup(DGRAD_EPILOGS, epilog, "input-gradient")
        self._check_2d("dy", dy), self._check_2d("w", w)
        self._check_same_dtype(dy=dy, w=w)
        if dy.shape[1] != w.shape[0]:
            raise BackendError(f"linear_dgrad: dy has {dy.shape[1]} features but w has "
                               f"{w.shape[0]} outputs (dy {dy.shape}, w {w.shape})")
        if spec.aux:
            self._check_aux(spec.activation, aux, w.shape[1], dy.shape[0], dy.dtype)
        return spec

    def linear_wgrad(self, dy, x, epilog="DEFAULT", *, overlap=False):
        """Weight gradient ``dw = dy.T @ x`` ``(out, in)``; with BGRADB also ``dy.sum(0)``.

        cuBLASLt view: ``dw.T = x.T @ dy`` (M = in, N = out, K = batch): BGRADB sums the B
        operand (dy) over K, which is exactly this layer's bias gradient.

        ``overlap=True`` inside ``overlapping_wgrad()``: the backend may run it concurrently
        with the work issued after it; its results may be read only once that scope ended.
        """
        spec = self._check_wgrad(dy, x, epilog)
        self.calls["linear_wgrad/" + spec.name] += 1
        if overlap:
            return self._linear_wgrad_overlapped(dy, x, spec)
        return self._linear_wgrad(dy, x, spec)

    def _check_wgrad(self, dy, x, epilog):
        """``linear_wgrad``'s operand checks; returns the epilog's spec."""
        spec = lookup(WGRAD_EPILOGS, epilog, "weight-gradient")
        self._check_2d("dy", dy), self._check_2d("x", x)
        self._check_same_dtype(dy=dy, x=x)
        if dy.shape[0] != x.shape[0]:
            raise BackendError(f"linear_wgrad: dy has batch {dy.shape[0]} but the saved input "
                               f"has batch {x.shape[0]}: residuals from another batch?")
        return spec

    def linear_grads(self, dy, x, w, wgrad_epilog="DEFAULT", dgrad_epilog="DEFAULT",
                     aux=None, *, overlap=False):
        """Both gradients of a dense layer as one operation, where this backend has a fused
        form for these operands; None where it has not (the caller then runs
        ``linear_wgrad`` and ``linear_dgrad``).

        Returns ``(dw, db, dx, dbias)``: ``(dw, db) = linear_wgrad(dy, x, wgrad_epilog)``
        and ``(dx, dbias) = linear_dgrad(dy, w, dgrad_epilog, aux)``. On the GPU a skinny
        float16 layer (the output layer of a classifier at long batches) takes both from
        one pass that reads x once and writes dx once. ``overlap``: as ``linear_wgrad``'s;
        where the backend would run that weight gradient beside the input gradient, None.
        A backend without any fused form (``fuses_grads`` False) returns None without
        looking at the operands: an eager step's backward pays nothing for asking.
        """
        if not self.fuses_grads:
            return None
        wspec = self._check_wgrad(dy, x, wgrad_epilog)
        dspec = self._check_dgrad(dy, w, dgrad_epilog, aux)
        if x.shape[1] != w.shape[1]:
            raise BackendError(f"linear_grads: x has {x.shape[1]} features but w takes "
                               f"{w.shape[1]} inputs (x {x.shape}, w {w.shape})")
        out = self._linear_grads(dy, x, w, wspec, dspec, aux, overlap)
        if out is not None:
            self.calls[f"linear_grads/{wspec.name}+{dspec.name}"] += 1
        return out

    def wgrad_after_dgrad(self, dy, x) -> bool:
        """An overlapped weight gradient of these operands is best issued after the layer's
        input gradient (see ``CudaBackend.overlap_order``); False here: nothing overlaps."""
        return False

    def params_read(self):
        """Inside ``overlapping_wgrad(update_early=True)``: the work issued so far read
        params (a layer's backward that the backend cannot see into), so an early update
        must wait for it. Nothing to do here: nothing overlaps."""

    def lowest_wgrad_on_main(self, dy, x) -> bool:
        """The lowest layer's weight gradient of these operands (no input gradient follows
        it) is best run on the main stream, not overlapped (see
        ``CudaBackend.overlap_order``); False here: nothing overlaps."""
        return False

    def overlapping_wgrad(self, update_early=False):
        """A scope whose ``linear_wgrad(..., overlap=True)`` calls may run concurrently with
        the input-gradient chain (the CUDA backend: on a second stream, joined at the exit).
        A backward pass whose weight gradients nothing reads before it ends opens one.
        ``update_early=True``: the pass also never reads an overlapped layer's params after
        forking its weight gradient (``Serial``'s), so an optimizer update issued right
        after the scope may start before the join (the CUDA backend, in a captured step)."""
        return contextlib.nullcontext()

    # ---- standalone activations (when no matmul is there to fuse with) ----------------------
    def activation(self, x, activation, want_aux=True):
        """``(act(x), aux)`` for a 2-D x, aux in the same format the fused epilogs write."""
        self._check_activation(activation)
        self._check_2d("x", x)
        self.calls["activation/" + activation] += 1
        return self._activation(x, activation, want_aux)

    def activation_grad(self, dy, activation, aux):
        """``dy * act'(pre)`` from the saved aux."""
        self._check_activation(activation)
        self._check_2d("dy", dy)
        self._check_aux(activation, aux, dy.shape[1], dy.shape[0], dy.dtype)
        self.calls["activation_grad/" + activation] += 1
        return self._activation_grad(dy, activation, aux)

    def bias_grad(self, dy):
        """Sum over the batch (the bias gradient when no epilog could provide it)."""
        self.calls["bias_grad"] += 1
        return self._sum_rows(dy)

    # ---- loss ------------------------------------------------------------------------------
    def softmax_cross_entropy(self, logits, labels, grad_scale=None, grad_dtype=None):
        """``(mean loss, dlogits)`` for integer labels; the loss is a 0-d array.

        One fused kernel on the GPU. Half-precision logits are reduced in float32; dlogits
        comes back in the logits' dtype. Labels are assumed valid (``fuseflow.losses`` checks).
        ``grad_scale`` (a 0-d float32 array) and ``grad_dtype``: dlogits comes back as
        ``(dlogits_f32 * grad_scale).astype(grad_dtype)``, the float32 gradient of
        float32-cast logits (mixed precision's scaled loss gradient, in the same kernel).
        """
        self.calls["softmax_cross_entropy"] += 1
        return self._softmax_cross_entropy(logits, labels, grad_scale, grad_dtype)

    def _softmax_cross_entropy(self, logits, labels, grad_scale=None, grad_dtype=None):
        if grad_scale is not None or grad_dtype is not None:  # the unfused composition
            xp = self.xp
            if is_half(logits.dtype):
                logits = logits.astype(xp.float32)
            loss, grad = self._softmax_cross_entropy(logits, labels)
            if grad_scale is not None:
                grad = grad * xp.asarray(grad_scale, dtype=xp.float32)
            return loss, grad.astype(grad_dtype or grad.dtype, copy=False)
        xp = self.xp
        z = logits.astype(xp.float32) if is_half(logits.dtype) else logits
        z = z - z.max(axis=1, keepdims=True)
        ez = xp.exp(z)
        sum_ez = ez.sum(axis=1, keepdims=True)
        rows = xp.arange(len(labels))
        loss = (xp.log(sum_ez[:, 0]) - z[rows, labels]).mean()
        grad = ez / sum_ez
        grad[rows, labels] -= 1.0
        return loss, (grad / len(labels)).astype(logits.dtype, copy=False)

    # ---- the output layer with its loss -------------------------------------------------
    def linear_softmax_xent(self, x, w, bias, labels, dgrad_epilog="DEFAULT", aux=None,
                            grad_scale=None, grad_dtype=None):
        """A classifier's output layer, its loss and its input gradient as one operation,
        where this backend has a fused form for these operands; None where it has not (the
        caller then runs ``linear``, ``softmax_cross_entropy`` and ``linear_dgrad``).

        Returns ``(loss, y, dy, dx, dbias)``: ``y = x @ w.T + bias`` (the logits), ``(loss,
        dy) = softmax_cross_entropy(y, labels, grad_scale, grad_dtype)`` and ``(dx, dbias)
        = linear_dgrad(dy, w, dgrad_epilog, aux)``; ``dgrad_epilog=None`` skips the input
        gradient (dx and dbias None). ``dbias`` may still be being written on a side stream
        inside ``overlapping_wgrad()``: read it after that scope, like an overlapped weight
        gradient. Labels are assumed valid (``fuseflow.losses`` checks them).
        """
        spec = lookup(EPILOGS, "BIAS" if bias is not None else "DEFAULT", "forward")
        self._check_linear("linear_softmax_xent", spec, x, w, bias)
        dspec = None
        if dgrad_epilog is not None:
            dspec = lookup(DGRAD_EPILOGS, dgrad_epilog, "input-gradient")
            if dspec.aux:
                self._check_aux(dspec.activation, aux, w.shape[1], x.shape[0], x.dtype)
        out = self._linear_softmax_xent(x, w, bias, labels, dspec, aux, grad_scale, grad_dtype)
        if out is not None:
            self.calls["linear_softmax_xent"] += 1
        return out

    def _linear_softmax_xent(self, x, w, bias, labels, dspec, aux, grad_scale, grad_dtype):
        return None

    def linear_xent(self, x, w, bias, labels, grad_scale=None, grad_dtype=None):
        """A classifier's output layer and its loss as one operation, where this backend has
        a fused form for these operands; None where it has not (the caller then runs
        ``linear`` and ``softmax_cross_entropy``). Returns ``(loss, y, dy)``: ``y = x @ w.T
        + bias`` and ``(loss, dy) = softmax_cross_entropy(y, labels, grad_scale,
        grad_dtype)``. On the GPU a float16 layer with at most 16 classes at long batches
        (where ``linear_softmax_xent`` has no form) runs its tensor-core forward with the
        loss in the same kernel. Labels are assumed valid (``fuseflow.losses`` checks them).
        """
        if not self.fuses_xent:
            return None
        spec = lookup(EPILOGS, "BIAS" if bias is not None else "DEFAULT", "forward")
        self._check_linear("linear_xent", spec, x, w, bias)
        out = self._linear_xent(x, w, bias, labels, grad_scale, grad_dtype)
        if out is not None:
            self.calls["linear_xent"] += 1
        return out

    def _linear_xent(self, x, w, bias, labels, grad_scale, grad_dtype):
        return None

    def linear_xent_grads(self, x, w, bias, labels, dgrad_epilog="DEFAULT", aux=None,
                          grad_scale=None, grad_dtype=None, *, overlap=False):
        """A classifier's output layer, its loss and both its gradients as one operation,
        where this backend has a fused form for these operands; None where it has not (the
        caller then runs ``linear_softmax_xent``, ``linear_xent`` or the separate calls).

        Returns ``(loss, y, dw, db, dx, dbias)``: ``(loss, y, dy) = linear_xent(x, w, bias,
        labels, grad_scale, grad_dtype)``, ``(dw, db) = linear_wgrad(dy, x, "BGRADB" with a
        bias)`` and ``(dx, dbias) = linear_dgrad(dy, w, dgrad_epilog, aux)``; dy itself is
        not kept. On the GPU (``fused_tc_head``) a 16-bit layer with at most 16 classes at
        long batches reads x once for all of it (``_cuda_tc_head``). ``overlap``: as
        ``linear_grads``'. Labels are assumed valid (``fuseflow.losses`` checks them).
        """
        if not self.fuses_xent_grads:
            return None
        spec = lookup(EPILOGS, "BIAS" if bias is not None else "DEFAULT", "forward")
        self._check_linear("linear_xent_grads", spec, x, w, bias)
        dspec = lookup(DGRAD_EPILOGS, dgrad_epilog, "input-gradient")
        if dspec.aux:
            self._check_aux(dspec.activation, aux, w.shape[1], x.shape[0], x.dtype)
        out = self._linear_xent_grads(x, w, bias, labels, dspec, aux, grad_scale, grad_dtype,
                                      overlap)
        if out is not None:
            self.calls["linear_xent_grads"] += 1
        return out

    def _linear_xent_grads(self, x, w, bias, labels, dspec, aux, grad_scale, grad_dtype,
                           overlap):
        return None

    # ---- random numbers (counter-based: the same bits on every backend) ---------------------
    def random_bits(self, key, shape, stream=0):
        """``ff.random.bits(key, shape, stream)`` as an array of this backend: uint32 bits
        that depend only on the key, the stream and the element's index (Philox4x32-10)."""
        self.calls["random_bits"] += 1
        shape = random._shape("random_bits", shape)  # both backends refuse a bad shape alike
        return self._random(key, shape, None, 0.0, random.check_stream(stream))

    def layer_keys(self, key, n):
        """``n`` keys, an ``(n, 2)`` uint32 array of this backend, derived from ``key`` (its
        ``KEY_STREAM`` bits): what a model hands its layers. On the GPU a device key gives
        device keys without leaving the GPU (inside a compiled step too)."""
        return self.random_bits(key, (n, 2), random.KEY_STREAM)

    def dropout_scale(self, key, shape, dtype, rate):
        """Dropout's factor, in ``dtype``: ``1 / (1 - rate)`` where ``random_bits(key, shape)``
        is below ``ff.random.keep_threshold(rate)``, else 0 (so ``x * scale`` drops and
        rescales in one product, and the backward multiplies by the same array)."""
        dtype = self._check_rate(dtype, rate)
        self.calls["dropout_scale"] += 1
        return self._random(key, random._shape("dropout_scale", shape), dtype, float(rate))

    def dropout(self, key, x, rate):
        """Dropout's forward: ``(x * scale, scale)`` with ``scale`` as ``dropout_scale(key,
        x.shape, x.dtype, rate)`` gives it (on the GPU both from one pass over x)."""
        self._check_rate(x.dtype, rate)
        self.calls["dropout"] += 1
        return self._dropout(key, x, float(rate))

    def _dropout(self, key, x, rate):
        scale = self._random(key, x.shape, x.dtype, rate)
        return x * scale, scale

    @staticmethod
    def _check_rate(dtype, rate):
        """``dtype`` (a np.dtype) where ``rate`` is a dropout rate it can scale by."""
        if not 0.0 <= rate < 1.0:
            raise BackendError(f"dropout_scale: rate must be in [0, 1), got {rate!r}")
        dtype = np.dtype(dtype)
        if not np.isfinite(random.keep_factor(rate, dtype)):
            raise BackendError(f"dropout_scale: 1 / (1 - rate) = {1.0 / (1.0 - rate):.4g} is "
                               f"not finite in {dtype} (rate {rate!r}). Fix: a smaller rate, "
                               "or compute in float32.")
        return dtype

    def _random(self, key, shape, dtype, rate, stream=0):
        """Bits (``dtype`` None) or dropout factors, computed on the host (the reference)."""
        bits = random.bits(None if key is None else self.to_numpy(key), shape, stream)
        if dtype is None:
            return self.asarray(bits)
        keep = bits.astype(np.uint64) < np.uint64(random.keep_threshold(rate))
        return self.asarray(np.where(keep, random.keep_factor(rate, dtype), dtype.type(0)))

    # ---- placement -------------------------------------------------------------------------
    def asarray(self, x, dtype=None):
        raise NotImplementedError

    def to_numpy(self, x):
        raise NotImplementedError

    def stats(self) -> dict:
        return {"backend": self.name, "calls": dict(self.calls)}

    def reset_stats(self):
        self.calls.clear()

    # ---- checks ----------------------------------------------------------------------------
    def _check_2d(self, what, a):
        if getattr(a, "ndim", None) != 2:
            raise BackendError(f"{what} must be a 2-D array, got shape {getattr(a, 'shape', None)}")

    def _check_linear(self, op, spec, x, w, bias):
        """The operands of ``y = x @ w.T + bias``: 2-D, one dtype, matching widths."""
        self._check_2d("x", x), self._check_2d("w", w)
        self._check_same_dtype(x=x, w=w)
        if x.shape[1] != w.shape[1]:
            raise BackendError(f"{op}: x has {x.shape[1]} features but w expects "
                               f"{w.shape[1]} (w shape {w.shape}, x shape {x.shape})")
        self._check_bias(spec, bias, w.shape[0], w.dtype)

    def _check_same_dtype(self, **arrays):
        dts = {k: a.dtype for k, a in arrays.items()}
        if len(set(dts.values())) != 1:
            raise BackendError("operands must share one dtype, got "
                               + ", ".join(f"{k}={v}" for k, v in dts.items())
                               + ". Fix: cast the input, e.g. x.astype(w.dtype).")

    def _check_bias(self, spec, bias, out, dtype):
        if spec.bias != (bias is not None):
            raise BackendError(f"epilog {spec.name} {'needs' if spec.bias else 'takes no'} bias")
        if bias is not None and (bias.shape != (out,) or bias.dtype != dtype):
            raise BackendError(f"bias must have shape ({out},) and dtype {dtype}, "
                               f"got {bias.shape} {bias.dtype}")

    @staticmethod
    def _check_activation(activation):
        if activation not in ACTIVATIONS:
            raise BackendError(f"unknown activation {activation!r}; expected one of "
                               f"{', '.join(map(repr, ACTIVATIONS))}")

    def _check_aux(self, activation, aux, features, batch, dtype):
        import numpy as np

        key = f"{activation}_aux"
        if aux is None:
            raise BackendError(f"{key} is required by the {activation} gradient")
        want = aux_shape(activation, features, batch)
        if tuple(aux.shape) != want:
            raise BackendError(
                f"{key} has shape {tuple(aux.shape)} but a layer of {features} features at "
                f"batch {batch} needs {want}: residuals from another batch or another layer?")
        want_dtype = np.uint8 if activation == "relu" else dtype
        if aux.dtype != want_dtype:
            raise BackendError(f"{key} has dtype {aux.dtype}, expected {np.dtype(want_dtype)}")

    # ---- to implement ----------------------------------------------------------------------
    def _linear(self, x, w, bias, spec):
        raise NotImplementedError

    def _linear_dgrad(self, dy, w, spec, aux):
        raise NotImplementedError

    def _linear_wgrad(self, dy, x, spec):
        raise NotImplementedError

    def _linear_wgrad_overlapped(self, dy, x, spec):
        return self._linear_wgrad(dy, x, spec)

    def _linear_grads(self, dy, x, w, wspec, dspec, aux, overlap):
        return None

    def _activation(self, x, activation, want_aux):
        raise NotImplementedError

    def _activation_grad(self, dy, activation, aux):
        raise NotImplementedError

    def _sum_rows(self, a):
        raise NotImplementedError
