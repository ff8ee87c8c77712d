"""A run's checkpoints: the whole TrainState in one safetensors file per epoch.

``ckpt-epoch{N}.safetensors`` is written after epoch N, then the same state under
``last.safetensors`` (a real file, not a symlink, so it survives copying the folder to any
file system). Each write is atomic (``fuseflow.checkpoint.save``), and ``fit`` holds Ctrl-C
and SIGTERM back while the pair is written (``_signals.hold_interrupts``), so the two files
never disagree and an interrupted run always leaves its last full checkpoint behind.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import safetensors

from fuseflow import checkpoint, tree
from fuseflow.train._state import TrainState

__all__ = ["LAST", "epoch_checkpoint", "save_state", "load_state", "read_metadata"]

LAST = "last.safetensors"


def epoch_checkpoint(out_dir, epoch: int) -> Path:
    return Path(out_dir) / f"ckpt-epoch{epoch}.safetensors"


def save_state(path, state: TrainState, metadata: dict | None = None) -> None:
    if not isinstance(state, TrainState):
        raise TypeError(f"save_state: expected a TrainState, got {type(state).__name__}. "
                        "Fix: pass the state fit or init_state returned.")
    checkpoint.save(path, state, metadata=metadata)


def load_state(path, like: TrainState) -> TrainState:
    """The TrainState saved at ``path``; ``like`` (e.g. ``init_state(...)`` of the same model
    and optimizer) fixes the structure, shapes, dtypes and device, and any mismatch is a
    CheckpointError listing every difference."""
    if not isinstance(like, TrainState):
        raise TypeError(f"load_state: like must be a TrainState, got {type(like).__name__}. "
                        "Fix: like=init_state(model, optimizer, in_shape, key).")
    try:
        return checkpoint.load(path, like=like)
    except checkpoint.CheckpointError as e:
        if _only_optimizer_differs(path, like):
            raise checkpoint.CheckpointError(
                f"{e}\nEvery difference is in the optimizer state (opt_state); the params "
                "match. The checkpoint's run used another optimizer, schedule or precision "
                "than like's. Fix: build like with init_state(model, the optimizer of that "
                "run, ...).") from None
        raise


def _only_optimizer_differs(path, like: TrainState) -> bool:
    """Whether ``path`` holds ``like``'s params exactly (names and shapes) and only its
    optimizer state differs: then the model is right and the optimizer is not."""
    try:
        with safetensors.safe_open(str(path), framework="np") as f:
            found = {name: (tuple(f.get_slice(name).get_shape()),
                            np.dtype(_NP[f.get_slice(name).get_dtype()]))
                     for name in f.keys()}
    except Exception:  # noqa: BLE001 - unreadable: the original error says why
        return False
    expected = {name: (tuple(np.shape(leaf)), np.result_type(leaf)) for name, leaf in
                zip(tree.paths(like), tree.leaves(like))}
    differ = {n for n in set(found) | set(expected) if found.get(n) != expected.get(n)}
    return bool(differ) and all(n.startswith("1/") for n in differ)


#: safetensors' dtype names (``get_dtype()``) as NumPy dtypes
_NP = {"F64": "float64", "F32": "float32", "F16": "float16", "I64": "int64", "I32": "int32",
       "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16",
       "U8": "uint8", "BOOL": "bool"}


read_metadata = checkpoint.read_metadata
