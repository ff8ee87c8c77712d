"""Fetching a file into a folder, all or nothing, verified against its sha256.

A download is written under a temporary name in the destination folder
(``fuseflow._files.atomic_write``), hashed as it arrives, and moved onto its final name only
when the hash matches; so a broken connection, a Ctrl-C or a wrong mirror never leaves a
half file where a loader would find it.
"""

from __future__ import annotations

import contextlib
import hashlib
import urllib.request
from pathlib import Path

from tqdm import tqdm

from fuseflow._files import atomic_write

__all__ = ["fetch", "sha256_file"]

_CHUNK = 1 << 20


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def fetch(name: str, folder: Path, mirrors, sha256: str, timeout: float = 60.0) -> Path:
    """Download ``name`` from the first mirror that serves it with the right sha256.

    Returns the final path. Raises ``OSError`` listing every mirror's failure otherwise.
    """
    created = [f for f in (folder, *folder.parents) if not f.exists()]  # innermost first
    folder.mkdir(parents=True, exist_ok=True)
    errors = []
    for base in mirrors:
        url = base.rstrip("/") + "/" + name
        try:
            return _fetch_one(url, folder / name, sha256, timeout)
        except (OSError, ValueError) as e:  # URLError and HTTPError are OSErrors
            errors.append(f"{url}: {e}")
    with contextlib.suppress(OSError):  # no empty cache folders left by an offline attempt
        for made in created:
            made.rmdir()
    raise OSError("could not download " + name + ":\n    " + "\n    ".join(errors))


def _fetch_one(url: str, dest: Path, sha256: str, timeout: float) -> Path:
    h = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=timeout) as response, \
            atomic_write(dest, suffix=".part") as out:
        total = int(response.headers.get("Content-Length") or 0) or None
        with tqdm(total=total, unit="B", unit_scale=True, desc=dest.name,
                  disable=None, leave=False) as bar:
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                h.update(chunk)
                bar.update(len(chunk))
        if h.hexdigest() != sha256:  # raised inside the block: the file is not kept
            raise ValueError(f"sha256 {h.hexdigest()} does not match the expected {sha256}")
    return dest
