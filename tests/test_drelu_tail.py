"""The own DRELU epilog's bias gradient (``_cuda_epilogs.drelu``): the batch's column sums
are added per chunk of rows, and the last block of each 256 columns to finish adds the
chunks' partials (arrival counters, ``_cuda_tickets``) instead of a second launch. Checked
against the second launch it replaces (the same bits: the same adds in the same order),
against float64 NumPy, over repeated calls (the counters reset themselves) and on a
stream of its own.

GPU only (skipped without one), like ``test_gpu_backend.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import fuseflow.backend as fb
from fuseflow.backend.numpy_backend import pack_relu_aux

if not fb.cuda_available():
    pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU", allow_module_level=True)

import cupy  # noqa: E402

from fuseflow.backend import _cuda_epilogs as E  # noqa: E402

pytestmark = pytest.mark.gpu

SHAPES = [(256, 1024), (600, 520), (4100, 1032), (17, 8)]  # (batch, features)


def case(rng, batch, features, dtype):
    dx = rng.standard_normal((batch, features)).astype(dtype)
    pre = rng.standard_normal((batch, features))
    return dx, pack_relu_aux(pre), pre >= 0


def run(dx, aux, *, ticket, splits=None):
    """``(dx, db)`` of ``E.drelu`` on copies, with the tail in the kernel or the second launch."""
    old, E.DRELU_TICKET = E.DRELU_TICKET, ticket
    try:
        d = cupy.asarray(dx)
        a = cupy.asarray(np.ascontiguousarray(aux.T)).T  # column-major, like the layers'
        part = None
        if splits:  # the partial products of a K split: their sum is dx
            part = cupy.stack([d / splits] * splits)
            d = cupy.empty_like(d)
        out, db = E.drelu(d, a, a.strides[1], bgrad=True, partials=part)
        return cupy.asnumpy(out), cupy.asnumpy(db)
    finally:
        E.DRELU_TICKET = old


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_tail_matches_the_second_launch_and_float64(rng, shape, dtype):
    """(float64 keeps the second launch, ``DRELU_TAIL``: there both runs take it.)"""
    dx, aux, mask = case(rng, *shape, dtype)
    out_t, db_t = run(dx, aux, ticket=True)
    out_s, db_s = run(dx, aux, ticket=False)
    np.testing.assert_array_equal(out_t, out_s, err_msg=f"seed {rng.seed}")
    np.testing.assert_array_equal(db_t, db_s, err_msg=f"seed {rng.seed}")
    ref = np.where(mask, dx.astype(np.float64), 0.0)
    np.testing.assert_array_equal(out_t, ref.astype(dtype), err_msg=f"seed {rng.seed}")
    # column sums of |terms| bound the rounding of any order of adds (float32 adds for
    # float16), plus the final rounding to the output dtype
    acc = np.float64 if dtype == np.float64 else np.float32
    scale = np.abs(ref).sum(0)
    tol = 4 * shape[0] * np.finfo(acc).eps * scale + np.finfo(dtype).eps * np.abs(ref.sum(0))
    assert np.all(np.abs(db_t - ref.sum(0)) <= tol + 1e-30), f"seed {rng.seed}"


@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=lambda d: np.dtype(d).name)
def test_tail_with_split_partials_and_repeats(rng, dtype):
    """Calls in a row with different data (each must leave the counters at zero for the
    next, or the next's tail never runs) agree bit for bit with the second launch, with
    and without K-split partials feeding the kernel."""
    from fuseflow.backend import _cuda_tickets as tickets

    for k, splits in enumerate((None, 3, None, 2)):
        if dtype == np.float16 and splits:
            continue  # no float16 partials (the split never takes float16)
        dx, aux, _ = case(rng, 256, 1024, dtype)
        got = run(dx, aux, ticket=True, splits=splits)
        assert not bool(tickets.counters(4).any()), f"counters left set after call {k}"
        ref = run(dx, aux, ticket=False, splits=splits)
        np.testing.assert_array_equal(got[0], ref[0], err_msg=f"call {k}, seed {rng.seed}")
        np.testing.assert_array_equal(got[1], ref[1], err_msg=f"call {k}, seed {rng.seed}")


def test_tail_on_another_stream(rng):
    """Each stream has counters of its own: a run on a fresh stream agrees with the default
    stream's."""
    dx, aux, _ = case(rng, 600, 520, np.float32)
    ref = run(dx, aux, ticket=True)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        got = run(dx, aux, ticket=True)
    stream.synchronize()
    np.testing.assert_array_equal(got[1], ref[1], err_msg=f"seed {rng.seed}")
