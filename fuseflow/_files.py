"""Writing a file all or nothing: ``atomic_write``.

    with atomic_write(path) as f:      # "wb" (default) or "w" (text)
        f.write(data)

The bytes go to a unique temporary file beside the target (``.<name>.<pid>.<random><suffix>``,
opened exclusively), are flushed and fsynced, then ``os.replace``-d onto the final name, and
the folder is fsynced. If the block raises (an error, Ctrl-C), the temporary file is removed
and the target is left as it was. A crash or kill at any moment therefore leaves either the
old file or the new one; only a kill that gives no chance to clean up (SIGKILL, power loss)
can leave such a hidden temporary file behind. Parent folders are created.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

__all__ = ["atomic_write", "fsync_dir"]

_MODES = {"wb": "xb", "w": "x"}


@contextlib.contextmanager
def atomic_write(path, mode: str = "wb", *, suffix: str = ".tmp"):
    """Yield a file object whose content replaces ``path`` when the block ends normally.

    ``mode`` is "wb" or "w"; ``suffix`` ends the temporary file's name (e.g. ".part").
    """
    if mode not in _MODES:
        raise ValueError(f"atomic_write: mode must be one of {', '.join(_MODES)}, got {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{suffix}")
    try:
        with open(tmp, _MODES[mode]) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:  # after a successful replace there is nothing left to remove
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def fsync_dir(folder) -> None:
    """Make a rename in ``folder`` durable; not every platform can open a folder, which is
    fine."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
