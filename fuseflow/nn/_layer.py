"""The layer contract, stated once.

A layer is an object holding only hyperparameters, with three pure methods:

    init(key, in_shape)                          -> (out_shape, params)
    forward(params, x, *, key=None, train=True)  -> (y, residuals)
    backward(params, residuals, dy)              -> (grads, dx)

``in_shape``/``out_shape`` exclude the batch dimension; ``x`` is ``(batch, features)``.
``params`` and ``grads`` are pytrees of identical structure. ``residuals`` is what backward
needs (inputs, masks); it belongs to exactly one forward call, one batch. ``key`` is a
``ff.random`` key for layers that draw random numbers (Dropout). With ``train=False`` a layer
may skip writing residuals that only backward needs (no relu_aux in inference).
"""

from __future__ import annotations

import inspect
import math

import numpy as np

from fuseflow._dtypes import FLOATS
from fuseflow._namespace import is_cupy


class LayerError(ValueError):
    """Bad input to a layer: the message names the layer, what it expected, what came, the fix."""


class Layer:
    #: set by layers whose backward accepts ``need_input_grad=False`` (skips computing dx)
    skips_input_grad = False
    #: set by layers whose training forward draws random numbers from its ``key`` (Dropout):
    #: ``ff.train.fit`` then hands a compiled step each step's key as a device array
    draws_random = False

    def init(self, key, in_shape):
        raise NotImplementedError

    def forward(self, params, x, *, key=None, train=True):
        raise NotImplementedError

    def backward(self, params, residuals, dy):
        raise NotImplementedError

    def apply(self, params, x, *, key=None):
        """Inference: the output of ``forward(..., train=False)``."""
        return self.forward(params, x, key=key, train=False)[0]

    def __repr__(self):
        return type(self).__name__ + "()"

    def error(self, message: str) -> LayerError:
        return LayerError(f"{self!r}: {message}")


#: the dtypes every backend computes in, for params and activations
FLOAT_DTYPES = FLOATS
#: their dtype.char: a string test is the cheapest check per call
_FLOAT_CHARS = "".join(d.char for d in FLOAT_DTYPES)
_FLOATS = ", ".join(d.name for d in FLOAT_DTYPES[:-1]) + f" or {FLOAT_DTYPES[-1].name}"
PARAMS_FIX = "Fix: use the params returned by this model's init."
RESIDUALS_FIX = "Fix: pass the residuals of the forward call that produced this output."

# Every check below reads only host-side metadata (type, shape, dtype), never array values:
# free on the GPU, and run once at capture time inside a compiled step. Eager steps run
# them on every call, so each passes with one cheap test and builds its message only when
# it fails.


def _is_backend_array(a) -> bool:
    """``a`` is a NumPy or CuPy array: not a JAX or PyTorch one, whose dtype may be NumPy's
    too (JAX's is) but which the backends cannot write into."""
    return isinstance(a, (np.ndarray, np.generic)) or is_cupy(a)


def _is_float(a) -> bool:
    """``a`` is a NumPy/CuPy array of a floating dtype (``FLOAT_DTYPES``)."""
    return _is_backend_array(a) and a.dtype.char in _FLOAT_CHARS


def check_array(layer, a, what="input", fix="np.asarray(x, dtype=np.float32), or ff.asarray(x) "
                "for a PyTorch/JAX tensor."):
    """``a`` is a NumPy or CuPy array; a LayerError with ``fix`` otherwise."""
    if not _is_backend_array(a):
        kind = type(a).__module__.split(".")[0]
        kind = f"{kind}.{type(a).__name__}" if kind not in ("builtins", "") else type(a).__name__
        raise layer.error(f"{what} must be an array (NumPy or CuPy), got {kind}. "
                          f"Fix: {fix.removeprefix('Fix: ')}")


def check_2d(layer, x, width=None, what="input"):
    """Check a (batch, features) array; a LayerError that shows the fix otherwise."""
    check_array(layer, x, what)
    shape = x.shape
    if len(shape) != 2 or (width is not None and shape[1] != width):
        want = f"(batch, {width})" if width is not None else "(batch, features)"
        if what == "dy":  # the gradient of this layer's output, not a batch of inputs
            fix = (f" Fix: pass dy shaped like this layer's output, {want}: the gradient of "
                   "the loss with respect to that output.")
        elif len(shape) > 2:
            fix = " Fix: flatten images first, x.reshape(len(x), -1), or add ff.nn.Flatten()."
        else:
            fix = (" Fix: pass a batch of the model's input width (check the in_shape given "
                   "to init).")
        raise layer.error(f"expected {what} of shape {want}, got {tuple(shape)}.{fix}")


def check_dtype(layer, x, dtype, what="input", fix=None):
    """``x.dtype == dtype``; the default fix casts ``x`` or the params."""
    if x.dtype != dtype:
        name = "x" if what == "input" else what
        fix = fix or (f"{name}.astype({dtype}), or cast the params with "
                      "ff.tree.astype(params, ...).")
        raise layer.error(f"expected {what} of dtype {dtype}, got {x.dtype}. Fix: {fix}")


def check_float(layer, a, what="input", fix="x.astype(np.float32)."):
    """``a`` is an array of a dtype the backends compute in (``FLOAT_DTYPES``)."""
    if _is_float(a):
        return
    check_array(layer, a, what)
    if a.dtype not in FLOAT_DTYPES:
        raise layer.error(f"expected {what} of a floating dtype ({_FLOATS}), got {a.dtype}. "
                          f"Fix: {fix}")


def check_keys(layer, params, want):
    """``params`` is a dict with exactly the keys ``want`` (a set)."""
    if not isinstance(want, (set, frozenset)):
        want = set(want)
    if not isinstance(params, dict) or params.keys() != want:
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise layer.error(f"params must be a dict with keys {sorted(want)}, got {got}. "
                          + PARAMS_FIX)


def check_param(layer, params, name, shape, dtype=None, dtype_of=None):
    """``params[name]``: a float array of ``shape`` (a str entry, e.g. "in", is any size)
    and, when given, of ``dtype`` (that of ``params[dtype_of]``)."""
    a = params[name]
    if _is_float(a) and _fits(a.shape, shape) and (dtype is None or a.dtype == dtype):
        return
    what = f"params[{name!r}]"
    check_array(layer, a, what, fix=PARAMS_FIX)
    check_float(layer, a, what, fix="ff.tree.astype(params, np.float32) (all of a model's "
                                    "params share one floating dtype).")
    if not _fits(a.shape, shape):
        want = "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
        raise layer.error(f"{what} must have shape {want}, got {tuple(a.shape)}: params from "
                          "another model? " + PARAMS_FIX)
    if dtype is not None and a.dtype != dtype:
        raise layer.error(f"expected {what} of dtype {dtype} (the dtype of params[{dtype_of!r}]), "
                          f"got {a.dtype}. Fix: ff.tree.astype(params, np.{dtype}) casts all "
                          "params to one dtype.")


def _fits(got, want) -> bool:
    """``got`` matches ``want``, whose str entries match any size."""
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if g != w and not isinstance(w, str):
            return False
    return True


def check_residuals(layer, residuals, *keys, cause="they come from another layer, or from "
                    "an inference forward (train=False)"):
    """``residuals`` is a dict holding ``keys``; the error names what is missing."""
    if isinstance(residuals, dict):
        for k in keys:
            if k not in residuals:
                break
        else:
            return
    have = residuals if isinstance(residuals, dict) else {}
    missing = [k for k in keys if k not in have]
    if missing:
        got = (f"keys {sorted(residuals)}" if isinstance(residuals, dict)
               else type(residuals).__name__)
        raise layer.error(f"residuals have no {' or '.join(map(repr, missing))} (got {got}): "
                          f"{cause}. Fix: pass the residuals that this layer's "
                          "forward(params, x, train=True) returned.")


def check_saved_shape(layer, dy, shape, what="dy"):
    """``dy`` has the shape of the output whose residuals are used (``shape``)."""
    check_array(layer, dy, what)
    if tuple(dy.shape) != tuple(shape):
        raise layer.error(f"{what} has shape {tuple(dy.shape)} but the residuals were saved for "
                          f"an output of shape {tuple(shape)}: residuals from another batch or "
                          "another layer. " + RESIDUALS_FIX)


def as_rows(a):
    """``a`` as ``(batch, features)``; the width is spelled out, since ``reshape(n, -1)``
    fails on an empty batch (a size-0 array leaves the -1 undetermined)."""
    return a.reshape(a.shape[0], math.prod(a.shape[1:]))


def shape_tuple(value):
    """``value`` as a tuple, an int as a 1-tuple (``784`` means ``(784,)``); None for what is
    neither an int nor a (non-string) iterable."""
    if _is_int(value):
        return (int(value),)
    if not isinstance(value, (str, bytes)):
        try:
            return tuple(value)
        except TypeError:  # not iterable: None, a float
            pass
    return None


def as_shape(layer, in_shape):
    """``in_shape`` as a tuple; an int is a width (``init(key, 784)`` means ``(784,)``)."""
    shape = shape_tuple(in_shape)
    if shape is not None:
        return shape
    raise layer.error(f"in_shape must be a tuple such as (784,), got {in_shape!r}. Fix: give "
                      "init the input's shape without the batch axis, x.shape[1:].")


def check_in_shape(layer, in_shape):
    """``in_shape`` is ``(features,)`` (or the int ``features``, as ``Serial.init`` takes
    it); returns it as a tuple of one int."""
    shape = (in_shape,) if _is_int(in_shape) else in_shape
    ok = (isinstance(shape, (tuple, list)) and len(shape) == 1
          and _is_int(shape[0]) and shape[0] >= 1)
    if not ok:
        got = tuple(shape) if isinstance(shape, (tuple, list)) else repr(in_shape)
        raise layer.error(f"in_shape must be (features,), got {got}. Fix: flatten the input, "
                          f"e.g. Serial(Flatten(), {layer!r}), and give init its width, e.g. "
                          "(784,).")
    return (int(shape[0]),)


# ---- hyperparameters (constructor arguments): the error names the class -------------------
def _is_int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def positive_int(cls, name, value, fix):
    if not _is_int(value) or value < 1:
        raise LayerError(f"{cls.__name__}: {name} must be a positive int, got {value!r}. "
                         f"Fix: {fix}")
    return int(value)


def number(cls, name, value, ok, want, fix):
    """A real number (not a bool) for which ``ok(value)`` holds; ``want`` says which."""
    real = isinstance(value, (int, float, np.integer, np.floating)) \
        and not isinstance(value, (bool, np.bool_))
    if not real or not ok(float(value)):
        raise LayerError(f"{cls.__name__}: {name} must be {want}, got {value!r}. Fix: {fix}")
    return float(value)


def float_dtype(cls, value, fix):
    """``param_dtype``: one of the floating dtypes the backends compute in."""
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or dtype not in FLOAT_DTYPES:
        raise LayerError(f"{cls.__name__}: param_dtype must be {_FLOATS}, got "
                         f"{dtype if dtype is not None else repr(value)}. Fix: {fix}")
    return dtype


def initializer(cls, name, fn):
    """``fn`` (``w_init``, ...) if it can be called as ``init(key, shape, dtype)``, or None.
    Caught here, at construction: a factory passed uncalled (``glorot_uniform`` for
    ``glorot_uniform()``) would fail in init with a bare TypeError."""
    if fn is None:
        return None
    if not callable(fn):
        raise LayerError(f"{cls.__name__}: {name} must be an initializer init(key, shape, dtype), "
                         f"got {fn!r}. Fix: e.g. {name}=nn.initializers.glorot_uniform().")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # no introspectable signature (a builtin): trust it
        return fn
    fname = getattr(fn, "__name__", type(fn).__name__)
    # our factories take their settings; our initializers (zeros, ...) take the key first
    if getattr(fn, "__module__", None) == "fuseflow.nn.initializers" \
            and list(sig.parameters)[:1] != ["key"]:
        args = ", ".join(p.name for p in sig.parameters.values() if p.default is p.empty)
        raise LayerError(f"{cls.__name__}: {name} is the initializer factory {fname}, not an "
                         f"initializer. Fix: pass nn.initializers.{fname}({args}), not {fname}.")
    try:
        sig.bind(None, (1,), np.float32)
    except TypeError:
        raise LayerError(f"{cls.__name__}: {name} {fname}{sig} cannot be called as init(key, "
                         "shape, dtype). Fix: define it as init(key, shape, dtype); an initializer "
                         "factory must be called, e.g. nn.initializers.glorot_uniform().") from None
    return fn


#: what each contract method returns, in order, as its error names it
_PAIRS = {"init": "(out_shape, params)", "forward": "(y, residuals)",
          "backward": "(grads, dx)"}


def returned_pair(layer, method, result):
    """``result`` of ``layer.<method>`` when it is the contract's pair; otherwise a LayerError
    that names the layer and the pair, where unpacking would give a bare "too many values
    to unpack" (or, for a forward returning only y of batch 2, unpack its rows)."""
    pair = _PAIRS[method]
    if isinstance(result, (tuple, list)) and len(result) == 2:
        if method != "init" or _is_shape(result[0]):
            return result
        raise LayerError(
            f"{layer!r}: init must return {pair}, out_shape first; got {type(result[0]).__name__}"
            f" {_short(result[0])} first. Fix: return out_shape (a tuple of ints without the "
            "batch axis, e.g. (features,)) and then params (docs/custom-layers.md).")
    got = (f"a {type(result).__name__} of {len(result)}" if isinstance(result, (tuple, list))
           else f"one {type(result).__name__}")
    raise LayerError(f"{layer!r}: {method} must return the pair {pair}, got {got}. Fix: "
                     f"return both, `return {pair[1:-1]}` (docs/custom-layers.md).")


def _is_shape(value) -> bool:
    return isinstance(value, (tuple, list)) and all(_is_int(n) for n in value)


def _short(value, limit=60):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def infer(model, params, x):
    """``model.apply(params, x)`` where the model has one, else its inference forward's output:
    a model of the user's own needs only the contract's three methods, not ``Layer``'s
    ``apply``."""
    apply = getattr(model, "apply", None)
    if apply is not None:
        return apply(params, x)
    return model.forward(params, x, train=False)[0]
