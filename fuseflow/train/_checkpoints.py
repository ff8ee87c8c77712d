"""A run's checkpoints: the whole TrainState in one safetensors file per epoch.

``ckpt-epoch{N}.safetensors`` is written after epoch N, then the same state under
``last.safetensors`` (a real file, not a symlink, so it survives copying the folder to any
file system). Each write is atomic (``fuseflow.checkpoint.save``), and ``fit`` holds Ctrl-C
and SIGTERM back while the pair is written (``_signals.hold_interrupts``), so the two files
never disagree and an interrupted run always leaves its last full checkpoint behind.
"""

from __future__ import annotations

from pathlib import Path

from fuseflow import checkpoint
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
        # every differing tensor under opt_state (field 1): the model is right, the optimizer not
        if e.paths and all(p.startswith("1/") for p in e.paths):
            raise checkpoint.CheckpointError(
                f"{e}\nEvery difference is in the optimizer state (opt_state); the params "
                "match. The checkpoint's run used another optimizer, schedule or precision "
                "than like's. Fix: build like with init_state(model, the optimizer of that "
                "run, ...).", e.paths) from None
        raise


read_metadata = checkpoint.read_metadata
