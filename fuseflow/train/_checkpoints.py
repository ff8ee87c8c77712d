"""A run's checkpoints: the whole TrainState in one safetensors file per epoch.

``ckpt-epoch{N}.safetensors`` is written after epoch N, then the same state under
``last.safetensors`` (a real file, not a symlink, so it survives copying the folder to any
file system). Each write is atomic (``fuseflow.checkpoint.save``), and Ctrl-C is held back
while the pair is written, so the two files never disagree and an interrupted run always
leaves its last full checkpoint behind.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path

from fuseflow import checkpoint
from fuseflow.train._state import TrainState

__all__ = ["LAST", "epoch_checkpoint", "save_state", "load_state", "read_metadata",
           "hold_interrupts", "interrupt_between_steps"]

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
    return checkpoint.load(path, like=like)


read_metadata = checkpoint.read_metadata


def _handles_sigint() -> bool:
    """Whether this code may take over SIGINT: only the main thread can install signal
    handlers, and a process that ignores SIGINT (``nohup``, a background job of a script)
    must go on ignoring it."""
    return (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN)


@contextlib.contextmanager
def hold_interrupts():
    """Hold back Ctrl-C (SIGINT) until the block ends, then raise KeyboardInterrupt.

    Where SIGINT cannot be handled here (``_handles_sigint``) the block runs as it is
    (each file write is still atomic on its own).
    """
    if not _handles_sigint():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


class _StopRequest:
    requested = False

    def check(self):
        """Raise KeyboardInterrupt here, at a safe point, if Ctrl-C was pressed."""
        if self.requested:
            raise KeyboardInterrupt


@contextlib.contextmanager
def interrupt_between_steps():
    """Turn Ctrl-C into a request that the loop honours between steps (``stop.check()``).

    Python raises KeyboardInterrupt wherever the signal lands; landing inside a finalizer
    or weakref callback it is printed as "Exception ignored" and lost, and training goes
    on. Here the handler only records the request; a second Ctrl-C interrupts at once.
    """
    stop = _StopRequest()
    if not _handles_sigint():
        yield stop
        return

    def handler(signum, frame):
        if stop.requested:
            raise KeyboardInterrupt
        stop.requested = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)
