"""Print a digest of every CUDA kernel source fuseflow generates, one line per variant.

For refactoring the code that writes kernel text on a machine without a GPU: run it before
and after the change and compare (``diff``). Identical output means every generated kernel
(the variants ``test_kernel_sources.py`` compiles) is byte for byte what it was, so the
GPU's results cannot have moved. It records the sources as that test does, with CuPy's
compiler replaced, and needs CuPy but neither a GPU nor NVRTC.

    python tests/kernel_sources_digest.py > /tmp/before.txt   # then after the change:
    python tests/kernel_sources_digest.py | diff /tmp/before.txt - && echo unchanged
"""

from __future__ import annotations

import hashlib
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_kernel_sources  # noqa: E402 - the tests folder is not a package on sys.path


def digests() -> list[str]:
    """``"<sha256> <kernel name>"`` for each generated source, in generation order."""
    patch = pytest.MonkeyPatch()
    try:
        sources = test_kernel_sources._generated_sources(patch)
    finally:
        patch.undo()
    return [f"{hashlib.sha256(code.encode()).hexdigest()} {name}" for name, code in sources]


if __name__ == "__main__":
    lines = digests()
    print("\n".join(lines))
    print(f"{len(lines)} kernel sources", file=sys.stderr)
