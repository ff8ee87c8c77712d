"""Pytree helpers: a thin, named layer over optree.

Parameters, gradients, optimizer state and residuals are all pytrees (nested dict, list,
tuple, NamedTuple of arrays). Everything here is pure: nothing is mutated.
"""

from __future__ import annotations

import numpy as np
import optree

from fuseflow._dtypes import is_half
from fuseflow._namespace import is_array, namespace

__all__ = [
    "add",
    "all_equal_structure",
    "astype",
    "first_changed_leaf",
    "flatten",
    "full_like",
    "l2_norm",
    "leaves",
    "leaves_with_paths",
    "map",
    "ones_like",
    "paths",
    "scale",
    "size",
    "structure",
    "sub",
    "unflatten",
    "vdot",
    "zeros_like",
]

# None is an empty node (as in JAX), so an absent entry never becomes an array.
_KW = {"none_is_leaf": False}


def map(fn, tree, *rest, is_leaf=None):
    return optree.tree_map(fn, tree, *rest, is_leaf=is_leaf, **_KW)


def leaves(tree, is_leaf=None):
    return optree.tree_leaves(tree, is_leaf=is_leaf, **_KW)


def structure(tree, is_leaf=None):
    return optree.tree_structure(tree, is_leaf=is_leaf, **_KW)


def flatten(tree, is_leaf=None):
    return optree.tree_flatten(tree, is_leaf=is_leaf, **_KW)


def unflatten(treedef, leaves_):
    return optree.tree_unflatten(treedef, leaves_)


def _path_str(path) -> str:
    return "/".join(str(p) for p in path)


def paths(tree):
    """Leaf paths as strings like ``"0/w"``, in leaf order (used in names and errors)."""
    return [_path_str(p) for p in optree.tree_paths(tree, **_KW)]


def leaves_with_paths(tree):
    return list(zip(paths(tree), leaves(tree)))


def zeros_like(tree):
    return map(lambda x: x * 0 if _is_scalar(x) else _xp(x).zeros_like(x), tree)


def ones_like(tree):
    return map(lambda x: _xp(x).ones_like(x), tree)


def full_like(tree, value):
    return map(lambda x: _xp(x).full_like(x, value), tree)


def astype(tree, dtype):
    return map(lambda x: x.astype(dtype), tree)


def add(a, b):
    return map(lambda x, y: x + y, a, b)


def sub(a, b):
    return map(lambda x, y: x - y, a, b)


def scale(tree, s):
    return map(lambda x: x * s, tree)


def vdot(a, b):
    """Sum over leaves of elementwise products (a 0-d array on the leaves' device). The
    trees must have the same structure."""
    (la, sa), (lb, sb) = flatten(a), flatten(b)
    if sa != sb or any(np.shape(x) != np.shape(y) for x, y in zip(la, lb)):
        shapes = f"{[np.shape(x) for x in la]} vs {[np.shape(y) for y in lb]}"
        raise ValueError(f"tree.vdot: the two trees do not match ({sa} vs {sb}; leaf shapes "
                         f"{shapes}). Fix: pass trees of the same structure and shapes, such as "
                         "params and grads.")
    parts = [(x * y).sum() for x, y in zip(la, lb)]
    return sum(parts[1:], parts[0]) if parts else 0.0


def l2_norm(tree):
    """Global L2 norm over all leaves: a scalar on the leaves' device (a 0-d array on the
    GPU, a NumPy scalar on the host; 0.0 without leaves). Python numbers count as 0-d."""
    ls = [x if hasattr(x, "dtype") else np.asarray(x) for x in leaves(tree)]
    if not ls:
        return 0.0
    xp = _xp(ls[0])
    squares = (xp.sum(x.astype(xp.float32) ** 2) if is_half(x.dtype) else xp.sum(x * x)
               for x in ls)  # half precision would overflow
    return xp.sqrt(sum(squares))


def size(tree) -> int:
    """Total number of elements over all leaves (for example, a model's parameter count)."""
    return int(sum(int(np.size(x)) for x in leaves(tree)))  # a Python number counts 1


def all_equal_structure(a, b) -> bool:
    return structure(a) == structure(b)


def first_changed_leaf(old, new):
    """``(path, old_leaf, new_leaf)`` of the first array leaf of ``old`` that ``new`` (of the
    same structure) does not hold as an array of the same shape and dtype, or None: what a
    step that must return its state in kind (donated buffers, checkpoints loaded with
    ``like``) is checked with."""
    for path, o, n in zip(paths(old), leaves(old), leaves(new)):
        if is_array(o) and not (is_array(n) and n.shape == o.shape and n.dtype == o.dtype):
            return path, o, n
    return None


def _is_scalar(x):
    return not hasattr(x, "shape")


def _xp(x):
    return namespace(x)
