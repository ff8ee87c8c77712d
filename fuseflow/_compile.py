"""``ff.compile``: a training step captured once into a CUDA graph, replayed every call.

Like ``jax.jit`` with ``donate_argnums``, for the host overhead that dominates small
models: a pure step ``step(params, opt_state, x, y) -> (params, opt_state, metrics)``

1. runs once eagerly, which plans every cuBLASLt matmul and allocates every buffer from a
   memory pool private to the compiled step;
2. runs again under CUDA stream capture: forward, loss, backward and optimizer update
   become one graph; the new params/opt_state are copied into the input buffers at its end
   (they are *donated*: updated in place);
3. every later call copies the batch into the graph's input buffers and replays the graph:
   one launch, no Python per layer.

On the GPU the returned params/opt_state are the donated buffers themselves; pass them back
in on the next call (anything else is copied in first). The metrics are graph-owned buffers
that the next call overwrites: read them (``float(m["loss"])``) or copy them before calling
again. A change of shapes, dtypes or tree structure compiles a new graph (cached per
signature). On NumPy arrays ``compile`` is a pass-through that returns new arrays (the inputs
keep their values), so one script runs on both backends if it uses only the returned values,
never the donated inputs, after a call; it checks the contract once per signature too.

``cast_args`` casts batch arguments on their way in, for a step that would cast them first
thing (mixed precision's float32 batch, used in float16): the step sees them cast, and on
the GPU the graph's first node casts while it copies (one read of the batch, one write of
the cast), instead of copying it and casting the copy.
"""

from __future__ import annotations

import contextlib
import inspect
import operator
import time
import warnings

import numpy as np

from fuseflow import backend, tree
from fuseflow._dtypes import FLOATS
from fuseflow._namespace import is_array, is_cupy
from fuseflow.backend import graph_capture
from fuseflow.backend._env import AUTOTUNE_MODES, env_choice

__all__ = ["CompileError", "CompiledStep", "compile"]


#: the number of signatures at which a compiled step warns that it keeps compiling
WARN_SIGNATURES = 8


class CompileError(ValueError):
    """The step's inputs/outputs do not fit the compile contract; the message says how."""


def compile(step, *, donate_argnums=(0, 1), autotune=None, cast_args=None):
    """Compile ``step`` (see the module docstring). ``donate_argnums`` name the arguments
    that the step returns updated, first and in the same order, e.g. params and opt_state.
    ``autotune`` times cuBLASLt's candidate algorithms for a matmul while compiling and keeps
    the fastest: ``"auto"`` (the default, or ``FUSEFLOW_AUTOTUNE=auto``) for float32 matmuls
    of at least 2^32 multiply-adds, where the heuristic's pick cost up to 1% of the step and a
    few seconds of timing pay off; ``True`` (``FUSEFLOW_AUTOTUNE=1``) for every matmul;
    ``False`` (``FUSEFLOW_AUTOTUNE=0``) never. Measured on the H200: docs/benchmarks.md.
    ``cast_args`` (``{argument index: dtype}``, e.g. ``{2: "float16"}``): those arguments,
    floating-point arrays that are not donated, reach the step cast to the dtype (float16,
    float32 or float64), as ``step(..., x.astype(dtype), ...)`` would; on the GPU the cast
    is the graph's copy of the batch itself."""
    if not callable(step):
        raise TypeError(f"compile: expected the step function, got {type(step).__name__}. "
                        "Fix: ff.compile(step), where step(params, opt_state, x, y) returns "
                        "(params, opt_state, metrics)")
    if autotune is None:
        autotune = env_choice("FUSEFLOW_AUTOTUNE", AUTOTUNE_MODES, "auto")
    if autotune not in AUTOTUNE_MODES.values():
        raise ValueError(f"compile: autotune must be True, False or 'auto', got {autotune!r}")
    donate = _donated(donate_argnums)
    return CompiledStep(step, donate, autotune, _casts(cast_args, donate))


def _donated(donate_argnums):
    """``donate_argnums`` as a tuple of distinct argument indices; an int names one, as in
    ``jax.jit``."""
    one = isinstance(donate_argnums, (int, np.integer)) and not isinstance(donate_argnums, bool)
    try:
        given = list((donate_argnums,) if one else donate_argnums)
        donate = None if any(isinstance(i, bool) for i in given) else \
            tuple(operator.index(i) for i in given)  # ints and NumPy integers, as jax.jit
    except TypeError:  # not iterable, or an element that is not an integer
        donate = None
    if donate is None or len(set(donate)) != len(donate) or not all(i >= 0 for i in donate):
        raise TypeError(f"compile: donate_argnums must be an argument index or a tuple of "
                        f"distinct ones, got {donate_argnums!r}. Fix: ff.compile(step, "
                        f"donate_argnums=(0, 1)) for step(params, opt_state, x, y)")
    return donate


#: The dtypes ``cast_args`` casts to and from.
CAST_DTYPES = FLOATS


def _casts(cast_args, donate):
    """``cast_args`` checked, as ``{index: np.dtype}``."""
    fix = "Fix: ff.compile(step, cast_args={2: 'float16'}) for step(params, opt_state, x, y)"
    if cast_args is None:
        return {}
    if not isinstance(cast_args, dict):
        raise TypeError(f"compile: cast_args must be a dict {{argument index: dtype}}, got "
                        f"{type(cast_args).__name__}. {fix}")
    casts = {}
    for i, dtype in cast_args.items():
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or i < 0:
            raise TypeError(f"compile: cast_args keys must be argument indices (ints >= 0), got "
                            f"{i!r}. {fix}")
        if int(i) in donate:
            raise ValueError(f"compile: cast_args names argument {i}, which is donated (the "
                             "step returns it updated, in its own dtype). Fix: cast only "
                             "batch arguments, or cast the donated value before the call")
        try:  # None is not a dtype here (np.dtype(None) is float64)
            dt = None if dtype is None else np.dtype(dtype)
        except TypeError:
            dt = None
        if dt is None or dt not in CAST_DTYPES:
            raise ValueError(f"compile: cast_args[{i}] must be one of "
                             f"{[d.name for d in CAST_DTYPES]}, got {dtype!r}. {fix}")
        casts[int(i)] = dt
    return casts


def _private_copy(x):
    return x.copy(order="C") if is_array(x) else x


def _signature(treedef, leaves):
    return treedef, tuple((tuple(x.shape), x.dtype.str) if is_array(x) else ("py", repr(x))
                          for x in leaves)


def _overlaps(a, spans):
    """Whether the memory of CuPy array ``a`` overlaps one of the ``(start, end)`` spans."""
    lo = a.data.ptr
    return any(lo < end and start < lo + a.nbytes for start, end in spans)


def _class_difference(new, old):
    """What a structure error cannot print: two node classes of the same name (the
    namedtuples of a state loaded without ``like``); "" when the first difference is not
    that."""
    if new.type is not old.type:
        if new.type is None or old.type is None or new.type.__name__ != old.type.__name__:
            return ""
        return (f". They print alike but the classes differ: {_qualname(new.type)} returned "
                f"for {_qualname(old.type)} given (a state loaded with ff.checkpoint.load "
                "without like?). Fix: ff.checkpoint.load(path, like=opt.init(params)), or "
                "return the given classes")
    for n, o in zip(new.children(), old.children()):
        if n != o:
            return _class_difference(n, o)
    return ""


def _qualname(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


class _Graph:
    """One captured graph: its static input buffers, outputs, and the capture that owns memory."""

    def __init__(self, capture, graph, static_args, outputs, compile_s, donate, plans=(),
                 inputs=None, caller_dtypes=None):
        self.capture, self.graph = capture, graph
        #: the graph's copy of the batch into its input buffers (``InGraphCopy``), or None:
        #: then each call copies the batch in before the launch
        self.inputs = inputs
        self.plans = list(plans)  # the graph replays their workspaces: they live as long as it
        self.static_args, self.outputs = static_args, outputs
        self.static_leaves = [x for x in tree.leaves(static_args) if is_array(x)]
        self.compile_s = compile_s
        self.free = [i for i in range(len(static_args)) if i not in donate]  # the batch
        #: the dtype callers pass for each free array argument (its buffer's, unless cast)
        self.caller_dtypes = {i: getattr(static_args[i], "dtype", None) for i in self.free}
        self.caller_dtypes.update(caller_dtypes or {})
        # Only plain-array free arguments qualify for the fast path.
        self.fast = all(is_array(static_args[i]) for i in self.free)


class CompiledStep:
    """What ``compile`` returns: called like the step. ``compiles`` (graphs captured),
    ``calls`` and ``compile_seconds`` tell what compiling cost, to report beside run times."""

    def __init__(self, step, donate_argnums, autotune, casts=None):
        self.step, self.donate, self.autotune = step, donate_argnums, autotune
        self.casts = dict(casts or {})  # {argument index: the dtype the step sees}
        self._graphs = {}
        self._last = None  # the graph of the previous call: the fast path's candidate
        self.compiles = 0
        self.calls = 0
        self._numpy_checked = set()  # the signatures whose NumPy call checked the contract
        self._signature = None  # the step's inspect.Signature, for keyword arguments

    def __repr__(self):
        return f"ff.compile({getattr(self.step, '__name__', self.step)!r})"

    @property
    def compile_seconds(self) -> float:
        """Total time spent compiling (eager warm-up, planning, capture), in seconds."""
        return sum(g.compile_s for g in self._graphs.values())

    def __call__(self, *args, **kwargs):
        if kwargs:
            args = self._positional(args, kwargs)
        g = self._last
        if g is not None and self._fast_path_fits(g, args):
            if g.inputs is not None:  # the graph copies the batch in: point it at this one
                g.inputs.set_sources([args[i] for i in g.free])
            else:
                copy = g.capture.copy_into
                for i in g.free:  # the batch: copied into the graph's input buffers
                    if args[i] is not g.static_args[i]:
                        copy(g.static_args[i], args[i])
            self.calls += 1
            g.capture.launch(g.graph)
            return g.outputs
        return self._call_slow(args)

    def _positional(self, args, kwargs):
        """Keyword arguments bound to the step's positions (``donate_argnums`` and the
        graph's inputs are positions), as ``jax.jit`` accepts them."""
        try:
            if self._signature is None:  # once: inspect.signature costs ~15 us a call
                self._signature = inspect.signature(self.step)
            bound = self._signature.bind(*args, **kwargs)
        except (TypeError, ValueError) as e:  # no signature, or arguments that do not fit
            raise CompileError(f"{self!r}: the keyword arguments {sorted(kwargs)} do not bind "
                               f"to the step's parameters ({e}). Fix: pass the arguments "
                               "positionally, step(params, opt_state, x, y)") from None
        if bound.kwargs:  # asked before the defaults: an unpassed keyword-only one is fine
            raise CompileError(f"{self!r}: the arguments {sorted(bound.kwargs)} bind to "
                               "keyword-only (or **) parameters, which have no position to "
                               "compile. Fix: make them positional parameters of the step and "
                               "pass them in order")
        bound.apply_defaults()  # a skipped defaulted parameter keeps the positions in line
        return bound.args  # keyword-only defaults stay the step's own

    def _fast_path_fits(self, g, args):
        """The usual loop: donated trees are the ones we returned, the rest same-shaped
        contiguous arrays. Skips flattening every pytree on every step."""
        if len(args) != len(g.static_args):
            return False
        for i in self.donate:  # the donated trees we returned are the static inputs
            if args[i] is not g.static_args[i]:
                return False
        for i in g.free:
            a, s = args[i], g.static_args[i]
            if not (is_cupy(a) and a.shape == s.shape and a.dtype == g.caller_dtypes[i]
                    and a.flags.c_contiguous):
                return False
        return True

    def _call_slow(self, args):
        self._check_casts(args)
        leaves, treedef = tree.flatten(args)
        sig = _signature(treedef, leaves)
        if not any(is_cupy(x) for x in leaves):  # NumPy: nothing to capture
            args = self._cast(args)
            if sig in self._numpy_checked:
                return self.step(*args)
            # the first call of each signature checks the contract, as a GPU compiles a
            # graph for each: so a script that runs here runs on a GPU
            self._check_donation(args)
            out = self.step(*args)
            self._check_outputs(out, args)
            self._numpy_checked.add(sig)
            self._warn_if_recompiling(len(self._numpy_checked))
            return out
        g = self._graphs.get(sig)
        if g is None:
            g = self._graphs[sig] = self._compile(args)
            self._warn_if_recompiling(len(self._graphs))
        copy, by_graph = g.capture.copy_into, set()
        sources = None  # the batch the graph copies in: alive until the launch is issued
        if g.inputs is not None:  # the graph copies the batch in: point it at this one
            for i in g.free:
                if not is_cupy(args[i]):
                    raise CompileError(
                        f"{self!r}: argument {i} is a {type(args[i]).__name__} but the step "
                        "was compiled for GPU arrays there. Fix: pass a CuPy array "
                        "(ff.device_put(x, 'cuda')), or compile a separate step for host data")
            sources = [a if a.flags.c_contiguous else a.copy() for a in (args[i] for i in g.free)]
            g.inputs.set_sources(sources)
            by_graph = {id(g.static_args[i]) for i in g.free}
        for dst, src in zip(g.static_leaves, (x for x in leaves if is_array(x))):
            if src is not dst and id(dst) not in by_graph:
                copy(dst, src if src.flags.c_contiguous else src.copy())
        self.calls += 1
        g.capture.launch(g.graph)
        del sources  # freed after the launch: stream order keeps them until the copy ran
        self._last = g if g.fast else None
        return g.outputs

    def _warn_if_recompiling(self, signatures):
        """Once, at the ``WARN_SIGNATURES``-th signature: something changes between calls
        (a Python number is part of the signature, as in ``jax.jit``'s static_argnums)."""
        if signatures == WARN_SIGNATURES:
            warnings.warn(
                f"{self!r} has now compiled for {signatures} different signatures (argument "
                "structure, shapes, dtypes and Python values): on a GPU each is its own CUDA "
                "graph with its own memory. A Python number that changes every call (a "
                "learning-rate factor, a step count) compiles anew each time. Fix: pass such "
                "values as 0-d arrays (np.asarray(v, np.float32), on the params' device)",
                RuntimeWarning, stacklevel=4)

    def _check_casts(self, args):
        """The arguments ``cast_args`` names are floating-point arrays (a cast of anything
        else is not what the step would make of it)."""
        for i in self.casts:
            a = args[i] if i < len(args) else None
            if not (is_array(a) and a.dtype in CAST_DTYPES):
                got = f"an array of dtype {a.dtype}" if is_array(a) else \
                    "missing" if i >= len(args) else f"a {type(a).__name__}"
                raise CompileError(
                    f"{self!r}: cast_args names argument {i}, which is {got}; it casts "
                    f"float16, bfloat16, float32 or float64 arrays to {self.casts[i].name}. "
                    f"Fix: pass a floating-point array there, or leave {i} out of cast_args")

    def _cast(self, args):
        """``args`` with ``cast_args``' arguments cast (a no-op copy-free where they already
        are in that dtype); contiguous, as the graph's buffers are."""
        if not self.casts:
            return args
        return tuple(a.astype(self.casts[i], order="C", copy=a.dtype != self.casts[i])
                     if i in self.casts else a for i, a in enumerate(args))

    # ---- compilation -----------------------------------------------------------------------
    def _compile(self, args):
        t0 = time.perf_counter()
        self._check_donation(args)
        capture = graph_capture()
        # cast_args: the graph's input buffers hold the cast batch, which its copy writes;
        # or (CAST_IN_COPY off, or a cast the copy has not) the batch as given, cast at the
        # start of the traced step
        casts = {i: d for i, d in self.casts.items() if capture.casts_in_copy(args[i].dtype, d)}
        # Private, contiguous copies of every input: the graph reads and writes only these.
        # in argument order: _flat_static hands the copies out in that order
        donated = [x for i in sorted(self.donate) for x in tree.leaves(args[i]) if is_cupy(x)]
        if capture.l2_persistence(sum(x.nbytes for x in donated)):
            static_args = self._flat_static(capture, args, donated, casts)
        else:
            static_args = capture.run(lambda: tuple(self._private(i, a, casts)
                                                    for i, a in enumerate(args)))
        late = {i: d for i, d in self.casts.items() if i not in casts}
        # Warm-up, exactly what will be captured: plans (and tunes) matmuls, compiles kernels,
        # fills the pool. (It updates the static params in place; every call copies its inputs
        # in.)
        with self._autotuning():
            capture.run(lambda: self._traced(static_args, late))
        # The capture under the warm-up's autotune setting: it must find every plan cached
        # as is (planning inside a stream capture would break it).
        with self._autotuning(), backend.get("cuda").recording_plans() as plans:
            batch = [static_args[i] for i in range(len(args)) if i not in self.donate]
            out, graph, inputs = capture.capture(
                lambda: self._traced(static_args, late),
                inputs=batch if all(is_cupy(b) for b in batch) else ())
        self.compiles += 1
        return _Graph(capture, graph, static_args, out, time.perf_counter() - t0, self.donate,
                      plans, inputs, {i: args[i].dtype for i in casts})

    def _flat_static(self, capture, args, donated, casts):
        """The private copies, the ``donated`` CuPy arrays side by side in one buffer (for
        one L2 persistence window over them: ``_cuda_l2``)."""
        flat = iter(capture.flat_copies(donated))

        def copy_arg(i, a):
            if i not in self.donate:
                return self._private(i, a, casts)
            return tree.map(lambda x: next(flat) if is_cupy(x) else _private_copy(x), a)

        return capture.run(lambda: tuple(copy_arg(i, a) for i, a in enumerate(args)))

    @staticmethod
    def _private(i, a, casts):
        """The graph's own copy of argument ``i`` (cast, where ``casts`` names it)."""
        if i in casts:
            return a.astype(casts[i], order="C")
        return tree.map(_private_copy, a)

    @contextlib.contextmanager
    def _autotuning(self):
        be = backend.get("cuda")
        previous = be.autotune
        be.autotune = self.autotune  # this compile's setting, whatever the backend's
        try:
            yield
        finally:
            be.autotune = previous

    def _traced(self, static_args, late_casts):
        """The step, then its donated results copied into the donated input buffers.
        ``late_casts``: arguments cast here, before the step, rather than in their copy."""
        out = self.step(*(backend.multi_tensor_cast([a], late_casts[i])[0]
                          if i in late_casts and a.dtype != late_casts[i] else a
                          for i, a in enumerate(static_args)))
        self._check_outputs(out, static_args)
        from fuseflow.backend._cuda_graph_inputs import copy_arrays

        result, pairs = list(out), []
        for k, i in enumerate(self.donate):
            pairs += [(o, n) for n, o in zip(tree.leaves(out[k]), tree.leaves(static_args[i]))
                      if is_array(o) and n is not o]
            result[k] = static_args[i]
        if not all(is_cupy(o) and is_cupy(n) for o, n in pairs):
            raise CompileError(f"{self!r}: the step returned host arrays for donated GPU "
                               "arguments. Fix: return the updated GPU arrays")
        # A new value that is not one C-contiguous span, or that reads a buffer one of the
        # copies writes (a leaf returned in another leaf's place), is copied out first.
        spans = [(o.data.ptr, o.data.ptr + o.nbytes) for o, _ in pairs]
        copy_arrays([(o, n if n.flags.c_contiguous and not _overlaps(n, spans) else n.copy())
                     for o, n in pairs])  # one kernel for all of them
        return tuple(result)

    def _check_donation(self, args):
        """Before anything is copied or run: the donated arguments exist and hold arrays."""
        for i in self.donate:
            if i >= len(args):
                raise CompileError(f"{self!r}: donate_argnums names argument {i} but the step "
                                   f"was called with {len(args)} arguments")
            for path, o in zip(tree.paths(args[i]), tree.leaves(args[i])):
                if not is_array(o):
                    raise CompileError(
                        f"{self!r}: argument {i} (donated) holds the Python value {o!r} at "
                        f"{path!r}, which a compiled step cannot update: on a GPU the graph "
                        "would return the value it was compiled with. Fix: make it a 0-d "
                        f"array, np.asarray({o!r}) (on the params' device)")

    def _check_outputs(self, out, args):
        """The contract: the step returns the donated arguments' new values first, each
        with the structure, shapes and dtypes of the argument it replaces."""
        if not isinstance(out, tuple) or len(out) < len(self.donate):
            raise CompileError(f"{self!r}: the step must return a tuple whose first "
                               f"{len(self.donate)} entries are the new values of the donated "
                               f"arguments {self.donate}, e.g. (params, opt_state, metrics)")
        for k, i in enumerate(self.donate):
            new, old = out[k], args[i]
            if tree.structure(new) != tree.structure(old):
                raise CompileError(f"{self!r}: output {k} must have the structure of argument "
                                   f"{i} (it is donated): {tree.structure(new)} vs "
                                   f"{tree.structure(old)}"
                                   + _class_difference(tree.structure(new), tree.structure(old)))
            changed = tree.first_changed_leaf(old, new)
            if changed is not None:
                path, o, n = changed
                got = f"{n.shape} {n.dtype}" if is_array(n) else type(n).__name__
                raise CompileError(
                    f"{self!r}: output {k} at {path!r} is {got} but the donated input "
                    f"there is {o.shape} {o.dtype}. Fix: return the updated value with "
                    f"the input's shape and dtype (cast it back if the step changed it)")
