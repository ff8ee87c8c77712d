"""Settings from the environment: a bad value warns and falls back to the default rather
than making the whole backend unavailable."""

from __future__ import annotations

import os
import warnings

#: The spellings of an on/off/auto setting (FUSEFLOW_AUTOTUNE, FUSEFLOW_OVERLAP_WGRAD) and
#: their values (``ff.compile(autotune=...)``, ``CudaBackend.autotune``, ...)
AUTOTUNE_MODES = {"1": True, "0": False, "auto": "auto"}


def env_int(name: str, default: int) -> int:
    """An integer setting ("4e9" allowed)."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(float(raw))
    except (ValueError, OverflowError):
        warnings.warn(f"{name}={raw!r} is not a number; using {default}", stacklevel=3)
        return default


def env_auto_int(name: str):
    """"auto" (the default) or a whole number."""
    raw = os.environ.get(name, "auto")
    if raw == "auto":
        return raw
    if raw.isascii() and raw.isdigit():
        return int(raw)
    warnings.warn(f"{name}={raw!r} is neither 'auto' nor a whole number; using 'auto'",
                  stacklevel=3)
    return "auto"


def env_choice(name: str, choices: dict, default):
    """The value ``choices[raw]`` of a setting with a fixed set of spellings."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    if raw not in choices:
        warnings.warn(f"{name}={raw!r} is not one of {sorted(choices)}; using the default",
                      stacklevel=3)
        return default
    return choices[raw]


def env_subset(name: str, allowed, default: str) -> set:
    """A comma-separated subset of ``allowed`` ("" for none); an unknown name warns and
    the default is used."""
    raw = os.environ.get(name)
    if raw is None:
        raw = default
    picked = {x for x in raw.replace(" ", "").split(",") if x}
    if not picked <= set(allowed):
        warnings.warn(f"{name}={raw!r}: {sorted(picked - set(allowed))} not among "
                      f"{sorted(allowed)}; using {default!r}", stacklevel=3)
        picked = {x for x in default.split(",") if x}
    return picked
