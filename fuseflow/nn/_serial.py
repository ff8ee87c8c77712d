"""Serial: layers in sequence, with matmul epilogs fused across layer boundaries.

The fusion engine. At construction Serial groups its layers into stages:

- a ``Dense`` with ``activation="relu"``/``"gelu"``, or a plain ``Dense`` directly followed
  by a ``ReLU()``/``GELU()`` layer, is one *dense stage*: its forward is a single
  RELU_AUX_BIAS / GELU_AUX_BIAS matmul (the separate activation layer does no work);
- every other layer is a stage of its own and runs its own forward/backward, as does a
  Dense subclass that overrides ``forward`` or ``backward`` (but not ``backward_fused``).

In backward, when a dense stage sits directly on top of a dense stage with an activation,
the upper stage's input-gradient matmul uses DRELU_BGRAD / DGELU_BGRAD with the lower
stage's aux: one call yields the lower stage's pre-activation gradient AND its bias
gradient, and the lower stage then needs only its weight-gradient matmul. No mask kernel,
no separate reduction. Everything else falls back to plain, correct forward/backward pairs.

The weight gradients of Serial's dense stages are needed by nothing inside the backward, so
Serial lets them overlap the input-gradient chain (on the GPU: a second stream, joined
before ``backward`` returns; see ``fuseflow.backend._cuda_overlap``). A subclass of Dense
that overrides ``backward_fused`` may read its grads there, so its stage does not overlap.

params, grads and residuals are tuples with one entry per layer (an absorbed ReLU/GELU has
``{}``); a fused stage keeps its mask under ``residuals[i]["relu_aux"]``.
"""

from __future__ import annotations

from typing import NamedTuple

from fuseflow import backend, random, tree
from fuseflow.backend.epilogs import AUX_KEYS
from fuseflow.nn._activation import GELU, ReLU
from fuseflow.nn._dense import Dense
from fuseflow.nn._layer import Layer, LayerError, as_shape, returned_pair
from fuseflow.ops.dense import dense_softmax_xent


class _Stage(NamedTuple):
    index: int                          # position of the Dense (or the only layer)
    dense: Dense | None              # None for a generic stage
    activation: str | None = None    # the stage's effective activation (dense stages)
    absorbed: int | None = None      # index of a ReLU/GELU layer fused into this Dense


def _fusable(layer) -> bool:
    """A Dense the fusion engine may drive through ``backward_fused``: Dense itself, or a
    subclass that overrides ``backward_fused`` or neither ``forward`` nor ``backward``. A
    subclass with its own ``forward``/``backward`` but Dense's ``backward_fused`` keeps the
    layer contract: the engine would skip its backward, or call its forward with Dense's
    ``activation=`` keyword."""
    if not isinstance(layer, Dense):
        return False
    kind = type(layer)
    return (kind.backward_fused is not Dense.backward_fused
            or (kind.forward is Dense.forward and kind.backward is Dense.backward))


def plan_stages(layers) -> list:
    """Group layers into fused dense stages and generic stages (see the module docstring)."""
    stages, i = [], 0
    while i < len(layers):
        layer = layers[i]
        if _fusable(layer):
            nxt = layers[i + 1] if i + 1 < len(layers) else None
            if layer.activation is None and type(nxt) in (ReLU, GELU):
                stages.append(_Stage(i, layer, nxt.activation, i + 1))
                i += 2
                continue
            stages.append(_Stage(i, layer, layer.activation))
        else:
            stages.append(_Stage(i, None))
        i += 1
    return stages


def _dtype(a):
    """An array's dtype, the type's name for anything else (in messages)."""
    return getattr(a, "dtype", type(a).__name__)


def _shape(a) -> str:
    """``"shape (8, 16)"`` for an array, the type's name for anything else (in messages)."""
    return f"shape {tuple(a.shape)}" if hasattr(a, "shape") else type(a).__name__


def _builtin(layer) -> bool:
    """One of fuseflow's own layers (not a user's subclass): its backward keeps the
    contract that Serial checks for custom layers on every eager step."""
    return type(layer).__module__.startswith("fuseflow.nn.")


def _overlappable(dense) -> bool:
    """Dense's own backward_fused: it returns its weight gradient without reading it."""
    return type(dense).backward_fused is Dense.backward_fused


class Serial(Layer):
    skips_input_grad = True
    releases_residuals = True

    @property
    def draws_random(self) -> bool:
        """Whether any layer draws random numbers in training (then it needs a key)."""
        return any(getattr(layer, "draws_random", False) for layer in self.layers)

    def __init__(self, *layers):
        if len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            layers = tuple(layers[0])
        for i, layer in enumerate(layers):
            if isinstance(layer, type):  # init would fail later, missing its self
                raise TypeError(f"Serial: argument {i} is the class {layer.__name__}, not a layer. "
                                f"Fix: pass {layer.__name__}() (call it).")
            if not all(callable(getattr(layer, m, None)) for m in ("init", "forward", "backward")):
                raise TypeError(f"Serial: layer {i} ({layer!r}) is not a layer: it needs init, "
                                "forward and backward methods (see the custom-layer guide).")
        self.layers = tuple(layers)
        self.stages = plan_stages(self.layers)

    def __repr__(self):
        return "Serial(" + ", ".join(map(repr, self.layers)) + ")"

    def _where(self, i):
        return f"Serial layer {i} ({self.layers[i]!r})"

    def _wrap(self, i, error):
        """Re-raise a layer's error with its position in this Serial, naming the layer once."""
        msg, own = str(error), repr(self.layers[i]) + ": "
        return LayerError(f"{self._where(i)}: {msg.removeprefix(own)}")

    def _check_tree(self, tree, what):
        if not isinstance(tree, (tuple, list)) or len(tree) != len(self.layers):
            got = (f"{len(tree)} entries" if isinstance(tree, (tuple, list))
                   else type(tree).__name__)
            raise LayerError(f"{self!r}: {what} must be a tuple with one entry per layer "
                             f"({len(self.layers)}), got {got}. Fix: use the {what} that this "
                             f"model's {'init' if what == 'params' else 'forward'} returned.")

    def init(self, key, in_shape):
        keys = random.split(key, max(1, len(self.layers)))
        params, shape = [], as_shape(self, in_shape)
        for i, (layer, k) in enumerate(zip(self.layers, keys)):
            try:
                shape, p = returned_pair(layer, "init", layer.init(k, shape))
            except LayerError as e:
                raise self._wrap(i, e) from None
            params.append(p)
        return shape, tuple(params)

    def forward(self, params, x, *, key=None, train=True):
        self._check_tree(params, "params")
        residuals = [{} for _ in self.layers]
        x = self._forward_stages(params, x, key, train, residuals, len(self.stages))
        return x, tuple(residuals)

    def _forward_stages(self, params, x, key, train, residuals, count):
        """The first ``count`` stages' forward; their residuals go into ``residuals``."""
        keys = [None] * len(self.layers)
        if key is not None and any(st.dense is None for st in self.stages[:count]):
            # only layers other than Dense take keys; derived where the key is (on the GPU
            # inside a compiled step)
            try:
                keys = backend.of(key).layer_keys(key, len(self.layers))
            except (TypeError, ValueError) as e:
                raise LayerError(f"{self!r}: the key: {e}") from None
        for s, st in enumerate(self.stages[:count]):
            i = st.index
            try:
                if st.dense is not None:
                    x, residuals[i] = st.dense.forward(params[i], x, train=train,
                                                       activation=st.activation)
                    continue
                layer = self.layers[i]
                y, residuals[i] = returned_pair(
                    layer, "forward", layer.forward(params[i], x, key=keys[i], train=train))
            except LayerError as e:
                raise self._wrap(i, e) from None
            self._check_output(s, params, x, y)
            x = y
        return x

    def _check_output(self, s, params, x, y):
        """A generic stage's output must have the width its init declared: the Dense stage
        above was initialised for it (``w`` is ``(out, in)``) and would otherwise get the
        blame. Only known where a Dense follows: Serial keeps nothing from init."""
        above = self.stages[s + 1] if s + 1 < len(self.stages) else None
        p = params[above.index] if above is not None and above.dense is not None else None
        w = p.get("w") if isinstance(p, dict) else None
        width = getattr(w, "shape", ())[1:]
        if len(width) != 1:
            return  # no Dense above, or params the Dense itself will reject
        if getattr(y, "shape", ())[1:] == width:
            self._check_output_dtype(s, above.dense, w, x, y)
            return
        got, fix = _shape(y), "make init return the output shape forward produces."
        if s == 0 or self.stages[s - 1].dense is None:  # the input is unchecked: may be wrong
            got, fix = (f"{got} for an input of {_shape(x)},",
                        "pass a batch of the in_shape given to init, or " + fix)
        raise LayerError(f"{self._where(self.stages[s].index)}: forward returned {got} but init "
                         f"declared (batch, {width[0]}). Fix: {fix}")

    def _check_output_dtype(self, s, dense, w, x, y):
        """A generic stage that changed the dtype to one the Dense above does not take
        (float64 out of float32, say) is named, not that Dense. A stage that kept a wrong
        input's dtype is not to blame (the Dense names the input's dtype then), and Dense
        subclasses with their own forward may take other dtypes."""
        if (not hasattr(y, "dtype") or y.dtype == w.dtype or y.dtype == _dtype(x)
                or type(dense).forward is not Dense.forward):
            return
        raise LayerError(
            f"{self._where(self.stages[s].index)}: forward returned dtype {y.dtype} (from "
            f"an input of {_dtype(x)}), but the Dense above computes in {w.dtype} (its "
            f"params) and would get the blame. Fix: return y in {w.dtype}, "
            f"y.astype(np.{w.dtype}); or, if the cast is intended, give that Dense "
            f"param_dtype=np.{y.dtype}.")

    def _check_grads(self, s, params, grads):
        """A generic stage's grads must have its params' tree structure: otherwise the
        optimizer would fail later with a message that names no layer. The usual case, a
        flat dict of arrays (or {}), passes on a key comparison; only other trees pay for
        ``tree.structure`` (this runs on every eager step)."""
        if type(grads) is dict and type(params) is dict and grads.keys() == params.keys() \
                and all(hasattr(v, "shape") for v in params.values()) \
                and all(hasattr(v, "shape") for v in grads.values()):
            return
        if tree.structure(grads) != tree.structure(params):
            raise LayerError(f"{self._where(self.stages[s].index)}: backward returned grads of "
                             f"structure {tree.structure(grads)}, but its params have "
                             f"{tree.structure(params)}. Fix: return one gradient for every "
                             "param, in the params' structure and container types ({} for a "
                             "layer without params; zeros for a param that does not affect "
                             "the output).")

    def _check_dx(self, s, below, params, dy, dx):
        """A generic stage's dx must have its input's shape, known where a Dense stage is
        below (its output), and that Dense's dtype: otherwise that Dense would get the
        blame."""
        if below is None or below.dense is None or not getattr(dy, "shape", ()):
            return
        w = params[below.index].get("w") if isinstance(params[below.index], dict) else None
        if (hasattr(dx, "dtype") and hasattr(w, "dtype") and dx.dtype != w.dtype
                and type(below.dense).backward_fused is Dense.backward_fused):
            raise LayerError(f"{self._where(self.stages[s].index)}: backward returned dx of "
                             f"dtype {dx.dtype}, but the Dense below computes in {w.dtype} "
                             f"(its params) and would get the blame. Fix: return dx in "
                             f"{w.dtype}, the dtype of forward's input x (dx.astype(x.dtype)).")
        want = (dy.shape[0], below.dense.features)
        if getattr(dx, "shape", None) != want:
            raise LayerError(f"{self._where(self.stages[s].index)}: backward returned dx of "
                             f"{_shape(dx)} but its input had shape {want}. Fix: return dx "
                             "with the shape of forward's input x.")

    def backward(self, params, residuals, dy, *, need_input_grad=True,
                 release_residuals=False):
        """``release_residuals=True`` (the caller hands over a list it owns, e.g.
        ``value_and_grad``): each stage's entries are set to None as it runs and a dense
        stage drops its saved input once its weight gradient is done, so saved activations
        are freed as the backward goes down (the input gradient reuses their memory; an
        input whose weight gradient runs on the side stream is freed at the join)."""
        self._check_tree(params, "params")
        self._check_tree(residuals, "residuals")
        if release_residuals and not isinstance(residuals, list):
            raise TypeError("Serial.backward: release_residuals=True needs residuals as a list "
                            "that the caller owns (list(residuals)), not a tuple")
        with backend.of(dy, where="Serial.backward").overlapping_wgrad(
                update_early=True):
            grads = [{} for _ in self.layers]
            dx = self._backward_stages(params, residuals, dy, need_input_grad,
                                       release_residuals, grads, len(self.stages))
            return tuple(grads), dx

    @property
    def softmax_head(self):
        """The final stage when it is a plain ``Dense`` (no activation) that
        ``softmax_xent_and_grad`` can run together with its loss; else None."""
        st = self.stages[-1] if self.stages else None
        if st is None or type(st.dense) is not Dense or st.activation is not None:
            return None
        own = type(self)  # a subclass that changes the passes keeps them
        if own.forward is not Serial.forward or own.backward is not Serial.backward:
            return None
        return st

    def softmax_xent_and_grad(self, params, x, labels, *, key=None, grad_scale=None,
                              grad_dtype=None, check=True):
        """``((loss, logits), grads)`` of ``softmax_cross_entropy(logits, labels)`` for
        ``logits = forward(params, x)``, the grads w.r.t. params (no input gradient).

        What ``ff.value_and_grad`` runs for a model whose last layer is a plain Dense
        (``softmax_head``): the output layer's forward, the loss and the output layer's
        input gradient (with the ReLU mask or GELU derivative of the layer below applied)
        are one operation,
        ``ops.dense.dense_softmax_xent``, one kernel on the GPU for short batches.
        ``grad_scale``/``grad_dtype``: as ``softmax_cross_entropy``'s (mixed precision).
        """
        head = self.softmax_head
        if head is None:
            raise LayerError(f"{self!r}: softmax_xent_and_grad needs a plain Dense (no "
                             "activation) as the last layer. Fix: use ff.value_and_grad, "
                             "which runs any model.")
        self._check_tree(params, "params")
        residuals = [{} for _ in self.layers]
        s, i = len(self.stages) - 1, head.index
        h = self._forward_stages(params, x, key, True, residuals, s)
        below = self.stages[s - 1] if s > 0 else None
        fuse = below is not None and below.dense is not None and below.activation is not None
        grads = [{} for _ in self.layers]
        with backend.of(h, where="Serial.backward").overlapping_wgrad(
                update_early=True):
            try:
                head.dense.check_params(params[i], h)
                residuals[i] = {"x": h}
                del h  # the op frees it once its last reader ran
                aux = residuals[below.index].get(AUX_KEYS[below.activation]) if fuse else None
                loss, logits, grads[i], dx, db_below = dense_softmax_xent(
                    params[i], residuals[i], labels, input_activation=below.activation
                    if fuse else None, input_aux=aux,
                    input_has_bias=fuse and "b" in params[below.index],
                    need_input_grad=s > 0, grad_scale=grad_scale, grad_dtype=grad_dtype,
                    check=check, release_input=True, overlap_wgrad=True)
            except LayerError as e:
                raise self._wrap(i, e) from None
            residuals[i] = None
            if s > 0:
                self._backward_stages(params, residuals, dx, False, True, grads, s,
                                      (dx, db_below) if fuse else None)
        return (loss, logits), tuple(grads)

    def _backward_stages(self, params, residuals, dy, need_input_grad, release_residuals,
                         grads, count, pre_grad=None):
        """The first ``count`` stages' backward, from the top one down, into ``grads``;
        returns the input gradient. ``pre_grad``: ``(dpre, dbias)`` of stage ``count - 1``,
        handed down by a fused input gradient above it."""
        for s in range(count - 1, -1, -1):
            st = self.stages[s]
            i, below = st.index, (self.stages[s - 1] if s > 0 else None)
            need_dx = need_input_grad or s > 0
            if st.dense is None:
                try:
                    layer = self.layers[i]
                    # a nested Serial (any layer with skips_input_grad) at the bottom of a
                    # backward that needs no input gradient skips its own first dx matmul
                    skip = {} if need_dx or not getattr(layer, "skips_input_grad", False) \
                        else {"need_input_grad": False}
                    grads[i], dx = returned_pair(
                        layer, "backward", layer.backward(params[i], residuals[i], dy, **skip))
                except LayerError as e:
                    raise self._wrap(i, e) from None
                # it may have forked weight gradients and read its params after: an early
                # optimizer update (update_early) waits for all of its work
                backend.of(dy, where="Serial.backward").params_read()
                if not _builtin(self.layers[i]):  # the library's own layers are tested
                    self._check_grads(s, params[i], grads[i])
                    self._check_dx(s, below, params, dy, dx)
                if release_residuals:
                    residuals[i] = None
                dy = dx
                continue
            try:
                fuse = (below is not None and below.dense is not None
                        and below.activation is not None and need_dx)
                below_res = residuals[below.index] if fuse else None
                aux = (below_res.get(AUX_KEYS[below.activation])
                       if isinstance(below_res, dict) else None)
                own = residuals[i]
                if release_residuals:  # the stage above already read our aux
                    residuals[i] = None
                    if st.absorbed is not None:
                        residuals[st.absorbed] = None
                    if isinstance(own, dict):  # ours to consume: the input goes once dw is done
                        own = dict(own)
                grads[i], dx, db_below = st.dense.backward_fused(
                    params[i], own, None if pre_grad else dy,
                    activation=st.activation, pre_grad=pre_grad, need_input_grad=need_dx,
                    input_activation=below.activation if fuse else None, input_aux=aux,
                    input_has_bias=fuse and "b" in params[below.index],
                    release_input=release_residuals,
                    **({"overlap_wgrad": True} if _overlappable(st.dense) else {}))
                del own
                pre_grad = (dx, db_below) if fuse else None
                dy = dx
            except LayerError as e:
                raise self._wrap(i, e) from None
        return dy if need_input_grad else None
