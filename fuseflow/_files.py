"""Writing a file all or nothing: ``atomic_write``.

    with atomic_write(path) as f:      # "wb" (default) or "w" (text)
        f.write(data)

The bytes go to a unique temporary file beside the target (``.tmp-<pid>-<random><suffix>``,
opened exclusively), are flushed and fsynced, then ``os.replace``-d onto the final name, and
the folder is fsynced. The temporary name is short and does not grow with the target's, so
any name the file system accepts for the target can be written. If the block raises (an
error, Ctrl-C), the temporary file is removed and the target is left as it was. A crash or
kill at any moment therefore leaves either the old file or the new one; only a kill that
gives no chance to clean up (SIGKILL, power loss) can leave such a hidden temporary file
behind. Parent folders are created; if a *file* stands where a parent folder should be,
``NotADirectoryError`` names it (see ``check_parent_folders``) and nothing is touched.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

__all__ = ["TEMP_PREFIX", "atomic_write", "check_parent_folders", "fsync_dir"]

_MODES = {"wb": "xb", "w": "x"}
TEMP_PREFIX = ".tmp-"  # every temporary file's name starts with it: .tmp-<pid>-<random><suffix>


def check_parent_folders(path, who: str = "atomic_write") -> None:
    """Raise ``NotADirectoryError`` naming the file that stands where a parent folder of
    ``path`` should be (the OS would only say "File exists" or "Not a directory"). Reads
    only; missing folders are fine (``atomic_write`` creates them)."""
    path = Path(path)
    for folder in path.parents:  # nearest first; the first one that exists decides
        if folder.is_dir():
            return
        if folder.exists() or folder.is_symlink():
            kind = "a file" if folder.is_file() else "a broken link or other non-folder"
            raise NotADirectoryError(
                f"{who}: cannot write '{path}': '{folder}' is {kind}, not a folder, so it cannot "
                f"hold the file. Fix: write to another path, or move or rename '{folder}' "
                "first (it was left untouched).")


@contextlib.contextmanager
def atomic_write(path, mode: str = "wb", *, suffix: str = ".tmp"):
    """Yield a file object whose content replaces ``path`` when the block ends normally.

    ``mode`` is "wb" or "w"; ``suffix`` ends the temporary file's name (e.g. ".part").
    """
    if mode not in _MODES:
        raise ValueError(f"atomic_write: mode must be one of {', '.join(_MODES)}, got {mode!r}")
    path = Path(path)
    check_parent_folders(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Short and independent of the target's name, so it fits wherever the target's name does;
    # in the target's folder, so that os.replace is a rename within one file system.
    tmp = path.with_name(f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}{suffix}")
    f = open(tmp, _MODES[mode])  # exclusive; if it fails there is no file of ours to remove
    try:
        with f:
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
