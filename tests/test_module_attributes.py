"""Every ``module.name`` that fuseflow's code, its tests and its benchmarks read from one
of fuseflow's modules names something that module defines, and every call
``module.function(...)`` fits that function's parameters; checked on the source text,
without importing anything.

Most of the CUDA backend runs only on a GPU, so a name removed from one module and still
read in another passes every CPU test; call 133 found one that way
(``_cuda_head`` read ``_cuda_skinny._acc`` after it had moved to ``_dtypes.accumulation``).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fuseflow"


def _module_path(dotted):
    """The file of the fuseflow module ``dotted`` (``fuseflow.backend._cuda_skinny``)."""
    base = ROOT.joinpath(*dotted.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@functools.cache
def _top_level_names(path):
    """The names a module defines at its top level (in ``if`` / ``try`` / ``with`` blocks
    too), plus its submodules where it is a package; None where it defines names
    dynamically (``__getattr__``, ``import *``, ``globals()``), so nothing can be said."""
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    if path.name == "__init__.py":
        names |= {p.stem for p in path.parent.glob("*.py")}
        names |= {p.name for p in path.parent.iterdir() if (p / "__init__.py").is_file()}

    def targets(node):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, (ast.Tuple, ast.List)):
            for elt in node.elts:
                yield from targets(elt)
        elif isinstance(node, ast.Starred):
            yield from targets(node.value)

    def walk(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    names.update(targets(t))
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                names.update(targets(node.target))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if alias.name == "*":
                        return False
                    names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                for part in ("body", "orelse", "finalbody"):
                    if walk(getattr(node, part, [])) is False:
                        return False
                for handler in getattr(node, "handlers", []):
                    if walk(handler.body) is False:
                        return False
        return True

    if walk(tree.body) is False or "__getattr__" in names:
        return None
    if any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "globals"
           for n in ast.walk(tree)):
        return None
    for node in ast.walk(tree):  # ``global x`` in a function defines x too
        if isinstance(node, ast.Global):
            names.update(node.names)
    return names


def _aliases(tree, path):
    """``{local name: dotted fuseflow module}`` for the modules a file imports whole
    (relative imports only inside the package)."""
    inside = path.is_relative_to(PACKAGE)
    # a package's __init__ keeps its name here, so level 1 is the package itself
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts) if inside else ""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("fuseflow") and alias.asname:
                    out[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level and not inside:
                continue
            if node.level:
                parent = package.rsplit(".", node.level)[0]
                base = f"{parent}.{base}" if base else parent
            if not base.startswith("fuseflow"):
                continue
            for alias in node.names:
                dotted = f"{base}.{alias.name}"
                if _module_path(dotted) is not None:
                    out[alias.asname or alias.name] = dotted
    return out


def _sources():
    return sorted([*PACKAGE.rglob("*.py"), *(ROOT / "tests").glob("*.py"),
                   *(ROOT / "benchmarks").glob("*.py")])


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_attributes_read_from_fuseflow_modules_exist(path):
    tree = ast.parse(path.read_text(), str(path))
    aliases = _aliases(tree, path)
    missing = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases):
            continue
        dotted = aliases[node.value.id]
        names = _top_level_names(_module_path(dotted))
        if names is not None and node.attr not in names:
            missing.append(f"line {node.lineno}: {node.value.id}.{node.attr} "
                           f"({dotted} defines no {node.attr!r})")
    assert not missing, f"{path.relative_to(ROOT)}: " + "; ".join(missing)


@functools.cache
def _signatures(path):
    """``{function: (positional names, keyword-only names, names with defaults, takes
    *args)}`` for a module's top-level functions without ``**kwargs``."""
    out = {}
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.args.kwarg:
            a = node.args
            positional = [x.arg for x in a.posonlyargs + a.args]
            defaults = set(positional[len(positional) - len(a.defaults):])
            defaults |= {x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None}
            out[node.name] = (positional, [x.arg for x in a.kwonlyargs], defaults,
                              a.vararg is not None)
    return out


def _call_mismatches(tree, aliases):
    """Calls ``alias.function(...)`` that pass an unknown keyword, too many positional
    arguments, or leave a required parameter out (calls with ``*`` or ``**`` are skipped)."""
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id in aliases):
            continue
        sig = _signatures(_module_path(aliases[node.func.value.id])).get(node.func.attr)
        if sig is None or any(isinstance(a, ast.Starred) for a in node.args) \
                or any(k.arg is None for k in node.keywords):
            continue
        positional, kwonly, defaults, varargs = sig
        keywords = {k.arg for k in node.keywords}
        problems = [f"no parameter {k!r}" for k in sorted(keywords - {*positional, *kwonly})]
        if not varargs and len(node.args) > len(positional):
            problems.append(f"{len(node.args)} positional arguments, at most {len(positional)}")
        given = {*positional[:len(node.args)], *keywords}
        problems += [f"{name!r} left out" for name in [*positional, *kwonly]
                     if name not in given and name not in defaults]
        if problems:
            out.append(f"line {node.lineno}: {node.func.value.id}.{node.func.attr}: "
                       + ", ".join(problems))
    return out


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_calls_of_fuseflow_functions_fit_their_parameters(path):
    tree = ast.parse(path.read_text(), str(path))
    bad = _call_mismatches(tree, _aliases(tree, path))
    assert not bad, f"{path.relative_to(ROOT)}: " + "; ".join(bad)


def test_the_call_check_finds_a_renamed_parameter():
    aliases = {"G": "fuseflow.backend._cuda_graph_inputs"}
    ok = ast.parse("G.copy_arrays([])\n")
    renamed = ast.parse("G.copy_arrays(pairz=[])\n")
    extra = ast.parse("G.copy_arrays([], [])\n")
    missing = ast.parse("G.copy_arrays()\n")
    assert _call_mismatches(ok, aliases) == []
    assert "no parameter 'pairz'" in _call_mismatches(renamed, aliases)[0]
    assert "at most 1" in _call_mismatches(extra, aliases)[0]
    assert "'pairs' left out" in _call_mismatches(missing, aliases)[0]


def test_the_check_finds_a_removed_name():
    """The check itself: a module that reads a name its import does not define fails."""
    names = _top_level_names(_module_path("fuseflow.backend._cuda_skinny"))
    assert names is not None and "forward_samples_per_block" in names
    assert "_acc" not in names
    assert _aliases(ast.parse("from fuseflow.backend import _cuda_skinny as S\n"),
                    PACKAGE / "backend" / "_cuda_head.py") == {
        "S": "fuseflow.backend._cuda_skinny"}
