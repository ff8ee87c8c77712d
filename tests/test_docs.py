"""Every Python block of the README and of docs/ runs as written.

Pages are what users copy first, so a block that no longer runs is a bug. The blocks of a
page run in order in one namespace (later blocks use what earlier ones defined), which
starts with ``import numpy as np``, ``import fuseflow as ff`` and ``from fuseflow import
nn``; the working directory is a temporary folder. An HTML comment on the line above a
block changes how it runs:

    <!-- doctest: raises NAME -->   the block must raise the exception class NAME (the page
                                    shows that error)
    <!-- doctest: gpu -->           needs a GPU: runs in ``test_page_gpu`` (marked ``gpu``)

To keep CI fast, ``ff.data.mnist`` hands the pages the first 2,048 examples of the real
files (``mnist_dir``, unless a page names its own folder) instead of all of them: the code
runs as written, on less data.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
_BLOCK = re.compile(r"(?:<!-- doctest: (?P<mode>[^>]*?) -->\n)?```python\n(?P<code>.*?)```",
                    re.S)
MNIST_EXAMPLES = 2048

def blocks(page: Path):
    """``(line, mode, code)`` of each Python block of ``page``."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start("code")) + 1, (m.group("mode") or "").strip(),
             m.group("code")) for m in _BLOCK.finditer(text)]


def _name(page: Path) -> str:
    return str(page.relative_to(REPO))


def _run_page(page, mnist_dir, monkeypatch, tmp_path, *, gpu: bool):
    import fuseflow.data

    real = fuseflow.data.mnist

    def first_examples(split="train", data_dir=None, **kwargs):
        x, y = real(split, mnist_dir if data_dir is None else data_dir, **kwargs)
        return x[:MNIST_EXAMPLES], y[:MNIST_EXAMPLES]

    monkeypatch.setattr(fuseflow.data, "mnist", first_examples)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"doc_{page.stem}"}
    exec("import numpy as np\nimport fuseflow as ff\nfrom fuseflow import nn", namespace)
    ran = 0
    for line, mode, code in blocks(page):
        if mode == "gpu" and not gpu:
            continue
        where = f"{_name(page)}, block at line {line}"
        compiled = compile(code, where, "exec")
        if mode.startswith("raises "):
            expected = mode.split()[1]
            with pytest.raises(Exception) as info:  # the class's name is checked below
                exec(compiled, namespace)
            assert type(info.value).__name__ == expected, (
                f"{where}: the page shows {expected}, the block raised "
                f"{type(info.value).__name__}: {info.value}")
        else:
            assert mode in ("", "gpu"), f"{where}: unknown doctest mode {mode!r}"
            exec(compiled, namespace)
        ran += 1
    return ran


def _needs_mnist(page):
    return any("ff.data.mnist" in code for _, _, code in blocks(page))


@pytest.fixture
def page_data(request):
    """MNIST for pages that load it, nothing (no skip) for the others."""
    page = request.param
    return page, (request.getfixturevalue("mnist_dir") if _needs_mnist(page) else None)


PAGES_WITH_CODE = [p for p in PAGES if blocks(p)]


@pytest.mark.parametrize("page_data", PAGES_WITH_CODE, ids=_name, indirect=True)
def test_page(page_data, monkeypatch, tmp_path):
    page, mnist_dir = page_data
    expected = sum(mode != "gpu" for _, mode, _ in blocks(page))
    assert _run_page(page, mnist_dir, monkeypatch, tmp_path, gpu=False) == expected


@pytest.mark.gpu
@pytest.mark.parametrize(
    "page_data", [p for p in PAGES if any(m == "gpu" for _, m, _ in blocks(p))], ids=_name,
    indirect=True)
def test_page_gpu(page_data, monkeypatch, tmp_path):
    import fuseflow as ff

    if not ff.backend.cuda_available():
        pytest.skip("needs an NVIDIA GPU with CuPy and nvmath-python")
    page, mnist_dir = page_data
    _run_page(page, mnist_dir, monkeypatch, tmp_path, gpu=True)


def test_pages_are_found():
    """The pages above hold the blocks this test runs; a renamed fence would skip them."""
    names = {_name(p) for p in PAGES_WITH_CODE}
    assert {"README.md", "docs/compile.md", "docs/custom-layers.md",
            "docs/getting-started.md", "docs/optimizers.md"} <= names
    for page in PAGES:
        assert "```py\n" not in page.read_text(), f"{_name(page)}: use ```python fences"
