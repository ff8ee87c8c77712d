"""Checkpoints: any pytree of arrays and scalars to one safetensors file, and back.

    ff.checkpoint.save("run/step_1000.safetensors", {"params": p, "opt": s},
                       metadata={"step": 1000})
    state = ff.checkpoint.load("run/step_1000.safetensors", like={"params": p, "opt": s})

Why this shape:
- safetensors, not pickle: loading a file runs no code, and other tools can read the
  tensors. Tensor names are the leaf paths (``fuseflow.tree.paths``, e.g. "params/0/w").
- The pytree structure travels in the file's metadata as JSON (``fuseflow_tree``): dict,
  list, tuple, NamedTuple (by type name and fields) and None nodes; leaves remember whether
  they were arrays, NumPy scalars or Python int/float/bool. Each tensor's CRC-32 is recorded
  too, so a flipped bit in the data is an error rather than a quietly wrong weight.
- Without ``like``, NamedTuples come back as ``collections.namedtuple`` classes of the same
  name and fields (not the original class, which the file cannot name safely), dict
  subclasses as dicts, and arrays on the host. With ``like``, its containers are used, each
  leaf goes to the device of the matching ``like`` leaf, and every difference in paths,
  shapes and dtypes is reported at once.
- Byte order is not part of a dtype here: arrays are stored little-endian (as safetensors
  requires), so a big-endian ``>f4`` array is saved as float32 and matches a ``>f4`` or a
  float32 ``like`` leaf alike. Without ``like`` arrays come back in native byte order; with
  ``like``, in the ``like`` leaf's exact dtype, byte order included.
- Writes are atomic (``fuseflow._files.atomic_write``): the bytes go to a unique temporary
  file beside the target (``.tmp-<pid>-<random>.tmp``, short whatever the target's name),
  are flushed and fsynced, then ``os.replace``-d onto the final name, and the folder is
  fsynced. A crash or kill at any moment leaves either the old checkpoint or the new one.
  Only a kill that gives no chance to clean up (SIGKILL, power loss) can leave such a
  hidden temporary file behind.
- ``fuseflow_format_version`` is checked on load, so an old fuseflow refuses a file written
  in a newer format instead of misreading it.
"""

from __future__ import annotations

import collections
import functools
import json
import zlib
from pathlib import Path

import numpy as np
import safetensors

from fuseflow import tree as _tree
from fuseflow._dtypes import bfloat16
from fuseflow._files import atomic_write, check_parent_folders
from fuseflow._namespace import is_cupy, namespace

__all__ = ["FORMAT_VERSION", "CheckpointError", "find_exact", "load", "read_metadata", "save"]

FORMAT_VERSION = 1
_VERSION_KEY, _TREE_KEY, _USER_KEY = "fuseflow_format_version", "fuseflow_tree", "fuseflow_metadata"
# Python scalar leaves are stored as 0-d arrays of these dtypes and come back as Python scalars.
_SCALARS = {bool: np.dtype(bool), int: np.dtype(np.int64), float: np.dtype(np.float64)}
# what can be stored: each (little-endian) dtype and its name in a safetensors header
_DTYPES = {np.dtype(t): code for t, code in (
    ("bool", "BOOL"), ("u1", "U8"), ("i1", "I8"), ("<u2", "U16"), ("<i2", "I16"),
    ("<u4", "U32"), ("<i4", "I32"), ("<u8", "U64"), ("<i8", "I64"), ("<f2", "F16"),
    ("<f4", "F32"), ("<f8", "F64"))}
_DTYPES[bfloat16] = "BF16"  # ml_dtypes' (a mixed-precision state's bfloat16 compute copy)


class CheckpointError(ValueError):
    """A checkpoint file is damaged, not a fuseflow checkpoint, or does not match ``like``;
    or (from ``save``) a leaf's value cannot be stored, such as an int beyond int64.
    ``paths``: for a mismatch with ``like``, the names of the tensors that differ."""

    def __init__(self, message: str, paths: tuple = ()):
        super().__init__(message)
        self.paths = tuple(paths)


# ---------------------------------------------------------------------------------- save

def save(path, tree, *, metadata: dict | None = None) -> None:
    """Write ``tree`` to ``path`` atomically (parent folders are created).

    ``metadata`` is any JSON-serialisable dict (JSON rules apply: tuples come back as lists,
    keys as strings); read it back with ``read_metadata``.

    Python ints are stored as int64; one outside its range raises ``CheckpointError``. A
    file where a parent folder should be raises ``NotADirectoryError`` naming it. Either
    way, before anything is written.
    """
    _check_not_folder(Path(path), "checkpoint.save")  # before the work, and before the OS
    check_parent_folders(path, "checkpoint.save")
    tensors: dict[str, np.ndarray] = {}
    spec = _encode(tree, (), tensors)
    user = metadata_json(metadata)
    header = {_VERSION_KEY: str(FORMAT_VERSION), _TREE_KEY: json.dumps(spec), _USER_KEY: user}
    head, order = _safetensors_header(tensors, header)  # any error before the file is touched
    with atomic_write(path) as f:
        f.write(head)
        for arr in order:
            f.write(arr.reshape(-1).view(np.uint8))  # contiguous (from _to_host): no copy


def _safetensors_header(tensors: dict, metadata: dict) -> tuple[bytes, list]:
    """The start of a safetensors file (the header's length as a little-endian uint64, then
    the JSON header padded with spaces to a multiple of 8 bytes) and the arrays to write
    after it, in that order. ``save`` writes each tensor straight from its array's memory:
    safetensors.numpy.save holds the whole file in memory twice first (Rust's buffer and the
    bytes object), which made an epoch's checkpoint of an Adam run the largest moment of its
    memory. As the library does, wider dtypes go first, so every tensor starts at a multiple
    of its item size for readers that map the file. Reading stays with the library
    (``safe_open``), and the tests read these files with it."""
    names = sorted(tensors, key=lambda n: (-tensors[n].dtype.itemsize, n))
    header, offset = {"__metadata__": metadata}, 0
    for name in names:
        arr = tensors[name]
        header[name] = {"dtype": _DTYPES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    try:
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, as os.fsdecode makes of undecodable bytes
        bad = next((n for n in names if not _is_utf8(n)), "?")
        raise CheckpointError(
            f"checkpoint.save: the leaf path {bad!r} is not valid Unicode text (it holds a "
            "lone surrogate, as os.fsdecode makes of bytes that are not UTF-8), and "
            "safetensors headers are UTF-8; nothing was written. Fix: rename the key to valid "
            "text.", (bad,)) from None
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, [tensors[n] for n in names]


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def metadata_json(metadata: dict | None) -> str:
    """``metadata`` as the JSON text ``save`` stores; TypeError (with the fix) when it is not
    a dict of JSON-serialisable values. For callers that check it before long work."""
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
    try:
        return json.dumps(metadata or {})
    except (TypeError, ValueError) as e:
        raise TypeError(f"metadata must be JSON-serialisable: {e}. Fix: store plain Python "
                        "values, e.g. float(loss) rather than a NumPy scalar.") from e


def _encode(node, path: tuple, tensors: dict):
    """JSON description of ``node``; its leaves are added to ``tensors`` under their paths."""
    if node is None:
        return None
    name = "/".join(str(p) for p in path)  # the same string as fuseflow.tree.paths
    if isinstance(node, dict):
        for k in node:
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise TypeError(f"checkpoint.save: dict key {k!r} at {_where(name)} is a "
                                f"{type(k).__name__}; only str and int keys can be saved")
        return {"dict": [[k, _encode(v, path + (k,), tensors)] for k, v in node.items()]}
    if isinstance(node, tuple) and hasattr(type(node), "_fields"):
        return {"namedtuple": type(node).__name__, "fields": list(node._fields),
                "items": [_encode(v, path + (i,), tensors) for i, v in enumerate(node)]}
    if isinstance(node, (list, tuple)):
        kind = "list" if isinstance(node, list) else "tuple"
        return {kind: [_encode(v, path + (i,), tensors) for i, v in enumerate(node)]}
    kind, arr = _to_host(node, name)
    if name in tensors or name == "__metadata__":
        raise TypeError(f"checkpoint.save: two leaves share the path {name!r} (or it is "
                        "reserved); rename a key so that leaf paths are unique")
    tensors[name] = arr
    return {"leaf": name, "kind": kind, "crc32": zlib.crc32(arr)}


def _to_host(leaf, name: str):
    """(kind, contiguous little-endian host array) for a leaf."""
    if type(leaf) in _SCALARS:
        kind = type(leaf).__name__
        try:
            arr = np.array(leaf, dtype=_SCALARS[type(leaf)])
        except OverflowError:  # only an int can overflow: bool and float always fit
            info = np.iinfo(_SCALARS[int])
            raise CheckpointError(
                f"checkpoint.save: leaf {_where(name)} is the int {_short(leaf)}, outside the "
                f"int64 range ({info.min} to {info.max}) that Python ints are stored in. Fix: "
                "store it as a float (float(x), if losing digits is fine), as a string in "
                "metadata= (str(x), exact), or as an array of a dtype that holds it.",
                (name,)) from None
    elif isinstance(leaf, np.generic):
        kind, arr = "numpy_scalar", np.asarray(leaf)
    elif isinstance(leaf, np.ndarray):
        kind, arr = "array", leaf
    elif is_cupy(leaf):
        kind, arr = "array", leaf.get()
    else:
        raise TypeError(f"checkpoint.save: leaf {_where(name)} is a {type(leaf).__name__}; "
                        "leaves must be NumPy/CuPy arrays, NumPy scalars or int/float/bool "
                        "(containers: dict, list, tuple, NamedTuple, None). Fix: put other "
                        "values in metadata=.")
    if arr.dtype.newbyteorder("<") not in _DTYPES:
        raise TypeError(f"checkpoint.save: leaf {_where(name)} has dtype {arr.dtype}, which "
                        "safetensors cannot store. Fix: cast it to a real or integer dtype.")
    return kind, np.asarray(arr, dtype=arr.dtype.newbyteorder("<"), order="C")


# ---------------------------------------------------------------------------------- load

def load(path, like=None):
    """Read the pytree saved at ``path``.

    With ``like`` (a pytree of the expected structure, e.g. freshly initialised params),
    the result has ``like``'s containers and each leaf is placed on the device of the
    matching ``like`` leaf; any difference in leaf paths, shapes or dtypes raises
    ``CheckpointError`` listing all of them.

    Byte order does not count as a difference: a file's float32 matches a ``>f4`` ``like``
    leaf. Arrays come back in the ``like`` leaf's exact dtype (so loading with the tree that
    was saved gives that tree back, big-endian arrays included); without ``like``, in native
    byte order.
    """
    path = Path(path)
    with _open(path, "checkpoint.load") as f:
        spec = _json(path, _header(path, f), _TREE_KEY)
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (not iterable)
    try:
        _check_leaves(path, spec, tensors)
        if like is None:
            return _decode(spec, tensors)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{path}: the structure recorded in the file is malformed "
                              f"({type(e).__name__}: {e}); the file is corrupted.") from e
    return _restore_like(path, like, tensors)


def read_metadata(path) -> dict:
    """The user ``metadata`` dict saved with the checkpoint (reads only the header)."""
    path = Path(path)
    with _open(path, "checkpoint.read_metadata") as f:
        return _json(path, _header(path, f), _USER_KEY)


def find_exact(paths, tree):
    """The first of ``paths`` whose checkpoint holds exactly ``tree`` (the same leaf paths,
    and leaf by leaf the same dtype, shape and bytes), or None.

    Each file is told apart by its header alone (the CRC-32 recorded for every leaf), so a
    folder of large checkpoints costs one pass over ``tree``, not a read of every file; only
    a file whose checksums all match is read whole to confirm it. Missing or unreadable
    files, and files that are not fuseflow checkpoints, hold nothing.
    """
    want = None
    for path in map(Path, paths):
        try:
            with safetensors.safe_open(path, framework="np") as f:
                saved = {leaf["leaf"]: leaf["crc32"]
                         for leaf in _leaf_specs(_json(path, _header(path, f), _TREE_KEY))}
                if want is None:  # the host copies and checksums, once for all files
                    tensors = {}
                    want = {leaf["leaf"]: (leaf["crc32"], tensors[leaf["leaf"]])
                            for leaf in _leaf_specs(_encode(tree, (), tensors))}
                if saved.keys() != want.keys() or any(
                        saved[n] != crc for n, (crc, _) in want.items()):
                    continue
                if all(_same_bits(f.get_tensor(n), a) for n, (_, a) in want.items()):
                    return path
        except (CheckpointError, OSError, KeyError, TypeError, ValueError,
                safetensors.SafetensorError):
            continue
    return None


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal to the bit (NaN included: a diverged run is still its own run)."""
    return _same_dtype(a.dtype, b.dtype) and a.shape == b.shape and a.tobytes() == b.tobytes()


def _check_not_folder(path: Path, who: str) -> None:
    """A run's folder is an easy slip for its checkpoint: say so plainly (for save, the OS
    error would name the temporary file instead)."""
    if path.is_dir():
        raise IsADirectoryError(f"{who}: '{path}' is a folder; save and load expect the "
                                "checkpoint file itself. Fix: give a file path such as "
                                f"{path / 'model.safetensors'}")


def _open(path: Path, who: str):
    _check_not_folder(path, who)
    if not path.exists():  # a typo: show what is there instead
        near = sorted(p.name for p in path.parent.glob("*.safetensors"))
        there = f"its folder holds {', '.join(near)}" if near else "no checkpoint beside it"
        raise FileNotFoundError(f"{who}: '{path}' does not exist ({there}). Fix: check the "
                                "path, or write the checkpoint first with checkpoint.save")
    open(path, "rb").close()  # the OS's own error: safetensors says "no such file" for any
    try:
        return safetensors.safe_open(path, framework="np")
    except safetensors.SafetensorError as e:
        raise CheckpointError(f"{path}: not a readable safetensors file; it is truncated, "
                              f"corrupted or of another format (safetensors: {e}). Fix: restore "
                              "it from another copy or an earlier checkpoint.") from e


def _header(path: Path, f) -> dict:
    header = f.metadata() or {}
    if _VERSION_KEY not in header:
        raise CheckpointError(
            f"{path}: a safetensors file, but not a fuseflow checkpoint (no "
            f"{_VERSION_KEY!r} in its metadata). Fix: read plain safetensors files with "
            "safetensors.numpy.load_file(path).")
    try:
        version = int(header[_VERSION_KEY])
    except ValueError:
        raise CheckpointError(f"{path}: {_VERSION_KEY} is {header[_VERSION_KEY]!r}, not an "
                              "integer; the file is corrupted.") from None
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: written in checkpoint format {version}, but this fuseflow reads formats "
            f"up to {FORMAT_VERSION}. Fix: upgrade fuseflow (pip install -U fuseflow).")
    if version < 1:
        raise CheckpointError(f"{path}: checkpoint format {version} does not exist; the file "
                              "is corrupted.")
    return header


def _json(path: Path, header: dict, key: str):
    try:
        return json.loads(header[key])
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{path}: the metadata entry {key!r} is missing or not valid "
                              f"JSON ({e}); the file is corrupted.") from e


def _check_leaves(path: Path, spec, tensors: dict) -> None:
    """The recorded leaves are exactly the file's tensors, each with its saved CRC-32."""
    leaves = {leaf["leaf"]: leaf for leaf in _leaf_specs(spec)}
    if set(leaves) != set(tensors):
        raise CheckpointError(f"{path}: the recorded structure names tensors "
                              f"{sorted(set(leaves) ^ set(tensors))} that the file does not "
                              "match; the file is corrupted.")
    for name, leaf in leaves.items():
        if zlib.crc32(tensors[name]) != leaf["crc32"]:
            raise CheckpointError(
                f"{path}: tensor {name!r} does not match the CRC-32 recorded when it was "
                "saved; the file is corrupted. Fix: restore it from another copy or an "
                "earlier checkpoint.")


def _leaf_specs(spec):
    if spec is None:
        return
    if "leaf" in spec:
        yield spec
        return
    if "dict" in spec:
        children = [v for _, v in spec["dict"]]
    else:
        children = spec["items"] if "namedtuple" in spec else spec.get("list", spec.get("tuple"))
    for child in children:
        yield from _leaf_specs(child)


def _decode(spec, tensors):
    if spec is None:
        return None
    if "leaf" in spec:
        return _from_host(tensors[spec["leaf"]], spec["kind"])
    if "dict" in spec:
        return {k: _decode(v, tensors) for k, v in spec["dict"]}
    if "namedtuple" in spec:
        cls = _namedtuple(spec["namedtuple"], tuple(spec["fields"]))
        return cls(*(_decode(v, tensors) for v in spec["items"]))
    if "list" in spec:
        return [_decode(v, tensors) for v in spec["list"]]
    return tuple(_decode(v, tensors) for v in spec["tuple"])


@functools.cache
def _namedtuple(name: str, fields: tuple):
    # One class per (name, fields), so trees loaded twice have equal structures.
    return collections.namedtuple(name, fields)


def _from_host(arr: np.ndarray, kind: str):
    if kind in ("bool", "int", "float"):
        return arr.item()
    if kind == "numpy_scalar":
        return arr[()]
    if kind == "array":
        return arr
    raise ValueError(f"unknown leaf kind {kind!r}")


def _expected(leaf, name: str):
    """(shape, dtype) a leaf of ``like`` stands for, its dtype as given (compare with
    ``_same_dtype``)."""
    if type(leaf) in _SCALARS:
        return (), _SCALARS[type(leaf)]
    if isinstance(leaf, (np.ndarray, np.generic)) or is_cupy(leaf):
        return tuple(leaf.shape), np.dtype(leaf.dtype)
    raise TypeError(f"checkpoint.load: leaf {_where(name)} of like is a "
                    f"{type(leaf).__name__}, not an array or int/float/bool")


def _restore_like(path: Path, like, tensors: dict):
    names, leaves = _tree.paths(like), _tree.leaves(like)
    expected = {n: _expected(leaf, n) for n, leaf in zip(names, leaves)}
    problems, paths = [], []
    for name, (shape, dtype) in expected.items():
        if name not in tensors:
            problems.append(f"missing from the file: {_where(name)} "
                            f"(like has {_desc(shape, dtype)})")
            paths.append(name)
            continue
        found = tensors[name]
        if found.shape != shape:
            problems.append(f"{_where(name)}: shape expected {shape}, found {found.shape}")
        same_dtype = _same_dtype(found.dtype, dtype)
        if not same_dtype:
            problems.append(f"{_where(name)}: dtype expected {dtype}, found {found.dtype}")
        if found.shape != shape or not same_dtype:
            paths.append(name)
    for name, found in tensors.items():
        if name not in expected:
            problems.append(f"not in like: {_where(name)} (the file has "
                            f"{_desc(found.shape, found.dtype)})")
            paths.append(name)
    if problems:
        raise CheckpointError(
            f"{path} does not match like ({len(problems)} difference"
            f"{'s' if len(problems) > 1 else ''}):\n  " + "\n  ".join(problems)
            + "\nFix: build like with the same model configuration the checkpoint was saved "
              "from, or load without like to inspect what the file holds.", paths)
    out = [_put_like(tensors[n], leaf) for n, leaf in zip(names, leaves)]
    return _tree.unflatten(_tree.structure(like), out)


def _same_dtype(a: np.dtype, b: np.dtype) -> bool:
    """Equal dtypes up to byte order (the file is always little-endian)."""
    return np.dtype(a).newbyteorder("<") == np.dtype(b).newbyteorder("<")


def _put_like(arr: np.ndarray, leaf):
    if type(leaf) in _SCALARS:
        return arr.item()
    if isinstance(leaf, np.generic):
        return arr[()]
    if is_cupy(leaf):
        with leaf.device:  # the like leaf's GPU, not merely the current one
            return namespace(leaf).asarray(arr)
    if arr.dtype != leaf.dtype:  # only the byte order can differ here: take like's
        return arr.astype(leaf.dtype)
    return arr


def _short(n: int) -> str:
    """An int as text, its middle elided when long; past 1000 bits only its size (str()
    refuses ints of more than 4300 digits, and a leaf could hold 10**10000)."""
    if n.bit_length() > 1000:
        return f"of about {int(n.bit_length() * 0.30103)} digits"
    text = str(n)
    return text if len(text) <= 40 else f"{text[:18]}...{text[-18:]} ({len(text)} digits)"


def _desc(shape, dtype) -> str:
    return f"{dtype} of shape {tuple(shape)}"


def _where(name: str) -> str:
    return repr(name) if name else "<root>"
