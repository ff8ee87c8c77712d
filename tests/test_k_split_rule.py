"""The CUDA backend's rule for splitting K itself (``fuseflow.backend._k_split``): pure
Python, so it is checked here without a GPU; ``test_k_split.py`` runs the split on one."""

from __future__ import annotations

import numpy as np
import pytest

from fuseflow.backend._k_split import MAX_PARTIALS, MAX_SLICE, k_slices, valid


@pytest.mark.parametrize("m, n, k, slices", [
    (256, 1024, 784, 2),      # 784-1024-1024-10, layer 1 forward (measured fastest)
    (256, 1024, 1024, 4),     # layer 2 forward and input gradient (measured fastest)
    (256, 1024, 1000, 5),     # 2 slices are too long, 4 of 250 are not 16-byte aligned
    (256, 1024, 514, 0),      # no aligned split at all
    (256, 1024, 300, 0),      # short K: not split
    (8192, 4096, 4096, 0),    # an output that fills the GPU: not split
    (512, 1024, 1024, 4),     # 128 tiles of 64 x 64: still under one wave
    (1024, 1024, 1024, 0),    # 256 tiles: not split
    (512, 1024, 4096, 0),     # 16 slices of 256: too many partial products
])
def test_auto_rule(m, n, k, slices):
    assert k_slices(m, n, k) == slices


def test_auto_slices_are_valid_and_short():
    for k in range(1, 3000):
        s = k_slices(256, 1024, k)
        assert s == 0 or (valid(k, s) and k // s <= MAX_SLICE and s * 256 * 1024 <= MAX_PARTIALS)


@pytest.mark.parametrize("setting, slices", [(7, 7), (np.int64(4), 4), (8, 0), (0, 0), (1, 0),
                                             (-2, 0), (16, 0)])
def test_a_number_is_used_where_it_divides_k_into_aligned_slices(setting, slices):
    assert k_slices(256, 1024, 784, setting) == slices   # 784 / 8 = 98, / 16 = 49


@pytest.mark.parametrize("setting", ["4", 2.0, True, None])
def test_other_settings_are_refused(setting):
    with pytest.raises(ValueError, match="k_splits must be 'auto' or a whole number"):
        k_slices(256, 1024, 784, setting)


@pytest.mark.parametrize("raw, value", [(None, "auto"), ("auto", "auto"), ("0", 0), ("4", 4),
                                        ("-1", "auto"), ("two", "auto"), ("²", "auto")])
def test_the_environment_setting(monkeypatch, raw, value):
    from fuseflow.backend._env import env_auto_int

    if raw is None:
        monkeypatch.delenv("FUSEFLOW_K_SPLITS", raising=False)
    else:
        monkeypatch.setenv("FUSEFLOW_K_SPLITS", raw)
    if value == "auto" and raw not in (None, "auto"):
        with pytest.warns(UserWarning, match="neither 'auto' nor a whole number"):
            assert env_auto_int("FUSEFLOW_K_SPLITS") == value
    else:
        assert env_auto_int("FUSEFLOW_K_SPLITS") == value
