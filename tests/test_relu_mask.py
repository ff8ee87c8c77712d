"""ReLU masks packed from the forward's output (``CudaBackend.relu_mask``): the matmul runs
RELU[_BIAS] and ``_cuda_epilogs.relu_mask`` sets a relu_aux bit where ``y > 0``, instead of
cuBLASLt's RELU_AUX[_BIAS] (bit set where the pre-activation is ``>= 0``).

Checked against the NumPy reference on small integers (every sum exact, many exact zeros,
where the two rules differ), on normal draws in every dtype, through the input gradient
that reads the mask, and in compiled float16 training steps. GPU only (skipped without
one), like ``test_gpu_backend.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import fuseflow as ff
import fuseflow.backend as fb
from fuseflow import nn
from fuseflow.backend.epilogs import relu_aux_rows
from fuseflow.backend.numpy_backend import NumpyBackend, pack_relu_aux, unpack_relu_aux

if not fb.cuda_available():
    pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU", allow_module_level=True)

import cupy  # noqa: E402

from fuseflow.backend import _cuda_epilogs as E  # noqa: E402
from fuseflow.backend.cuda_backend import CudaBackend  # noqa: E402

pytestmark = pytest.mark.gpu
DTYPES = [np.float16, np.float32, np.float64]


def output_mask(y):
    """The reference: relu_aux with bits set where ``y > 0`` (cuBLASLt's format)."""
    return pack_relu_aux(np.where(y > 0, 1.0, -1.0))


def backend(mode):
    be = CudaBackend(tf32=False, autotune=False)
    be.skinny_max = 0          # cuBLASLt's matmuls, not the one-kernel skinny forms
    be.own_gemm_max_macs = 0
    be.relu_mask = mode
    return be


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("batch,features", [(1, 8), (37, 24), (256, 1024), (129, 136)])
def test_relu_mask_kernel_matches_the_reference(rng, dtype, batch, features):
    y = np.maximum(rng.standard_normal((batch, features)), 0).astype(dtype)
    y[::3, ::5] = 0                                   # exact zeros: bits clear
    y[1::4, 2::7] = np.finfo(dtype).tiny              # the smallest positive: bits set
    rows = relu_aux_rows(features)
    aux = E.relu_mask(cupy.asarray(y), rows)
    assert aux.shape == (rows, batch) and aux.dtype == np.uint8
    np.testing.assert_array_equal(cupy.asnumpy(aux), output_mask(y), err_msg=f"seed {rng.seed}")


def test_relu_mask_kernel_refuses_unaligned_rows():
    with pytest.raises(ValueError, match="multiple of 8"):
        E.relu_mask(cupy.ones((4, 12), dtype=cupy.float32), relu_aux_rows(12))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("epilog", ["RELU_AUX_BIAS", "RELU_AUX"])
def test_forward_on_integers_gives_the_output_rule(rng, dtype, epilog):
    """Exact sums, many of them zero: y is the reference's bit for bit, the mask is
    ``y > 0`` (where the epilog's rule, ``pre >= 0``, also sets the zeros' bits)."""
    x, w = (rng.integers(-2, 3, shape).astype(dtype) for shape in ((45, 40), (32, 40)))
    b = rng.integers(-2, 3, 32).astype(dtype) if epilog.endswith("BIAS") else None
    be = backend("output")
    y, aux = be.linear(cupy.asarray(x), cupy.asarray(w),
                       None if b is None else cupy.asarray(b), epilog)
    y_ref, aux_epilog = NumpyBackend().linear(x, w, b, epilog)
    assert be.stats()["relu_mask_pass"] == 1
    np.testing.assert_array_equal(cupy.asnumpy(y), y_ref, err_msg=f"seed {rng.seed}")
    np.testing.assert_array_equal(cupy.asnumpy(aux), output_mask(y_ref), err_msg=f"seed {rng.seed}")
    zeros = (y_ref == 0) & unpack_relu_aux(aux_epilog, 32)    # pre == 0: the rules differ
    assert zeros.any(), f"no exact zero pre-activation (seed {rng.seed})"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_input_gradient_reads_the_output_mask(rng, dtype):
    """Forward with the mask from y, then DRELU_BGRAD of the layer above through it: the
    NumPy reference's dgrad with the ``y > 0`` mask, within the dtype's rounding."""
    batch, fin, hidden, fout = 64, 48, 40, 24
    x, w1, b1, w2, dy = (rng.standard_normal(shape).astype(dtype) for shape in
                         ((batch, fin), (hidden, fin), (hidden,), (fout, hidden), (batch, fout)))
    be = backend("output")
    h, aux = be.linear(cupy.asarray(x), cupy.asarray(w1), cupy.asarray(b1), "RELU_AUX_BIAS")
    dh, db = be.linear_dgrad(cupy.asarray(dy), cupy.asarray(w2), "DRELU_BGRAD", aux)
    h_host = cupy.asnumpy(h)
    dpre = (dy.astype(np.float64) @ w2.astype(np.float64)) * (h_host > 0)
    tol = {np.float16: 2e-2, np.float32: 1e-5, np.float64: 1e-12}[dtype]
    scale = np.abs(dpre).max()
    np.testing.assert_allclose(cupy.asnumpy(dh).astype(np.float64), dpre, rtol=tol,
                               atol=tol * scale, err_msg=f"seed {rng.seed}")
    np.testing.assert_allclose(cupy.asnumpy(db).astype(np.float64), dpre.sum(0), rtol=tol,
                               atol=tol * scale * np.sqrt(batch), err_msg=f"seed {rng.seed}")


@pytest.mark.parametrize("mode,dtype,min_macs,expected", [
    ("auto", np.float16, 0, 1), ("auto", np.float16, 2 ** 40, 0), ("auto", np.float32, 0, 0),
    ("epilog", np.float16, 0, 0), ("output", np.float32, 2 ** 40, 1)])
def test_which_forwards_pack_the_mask_from_the_output(rng, mode, dtype, min_macs, expected):
    be = backend(mode)
    be.relu_mask_min_macs = min_macs
    x, w = rng.standard_normal((32, 64)).astype(dtype), rng.standard_normal((16, 64)).astype(dtype)
    be.linear(cupy.asarray(x), cupy.asarray(w), None, "RELU_AUX")
    be.linear(cupy.asarray(x), cupy.asarray(w[:12]), None, "RELU_AUX")  # 12 features: never
    assert be.stats()["relu_mask_pass"] == expected


@pytest.fixture
def cuda_relu_mask():
    """The process's CUDA backend with its ``relu_mask`` restored afterwards."""
    be = fb.get("cuda")
    saved = be.relu_mask, be.relu_mask_min_macs
    yield be
    be.relu_mask, be.relu_mask_min_macs = saved


def test_compiled_float16_training_with_output_masks(cuda_relu_mask):
    """A compiled mixed-precision step whose masks come from the outputs: the same losses
    as its eager step (1e-5), and as the epilog's masks to float16 rounding (the rules
    differ only at zero pre-activations)."""
    from tests.test_compile import run_side_by_side

    model = nn.Serial(nn.Dense(256, "relu"), nn.Dense(128, "relu"), nn.Dense(10))
    _, params = model.init(ff.random.key(3), (784,))
    rng = np.random.default_rng(3)
    xs = cupy.asarray(rng.random((8, 64, 784), dtype=np.float32))
    ys = cupy.asarray(rng.integers(0, 10, (8, 64)))
    losses = {}
    for mode in ("output", "epilog"):
        cuda_relu_mask.relu_mask = mode
        cuda_relu_mask.reset_stats()
        opt = ff.mixed_precision.dynamic_loss_scaling(ff.optim.adam(1e-3),
                                                      compute_dtype="float16")
        step = ff.train.make_step(model, ff.losses.softmax_cross_entropy, opt,
                                  compute_dtype="float16")
        p, s = ff.device_put((params, opt.init(params)), "cuda")
        eager, graphed, _, _ = run_side_by_side(step, ff.compile(step), p, s, xs, ys, 30)
        np.testing.assert_allclose(graphed, eager, rtol=1e-5)
        assert (cuda_relu_mask.stats()["relu_mask_pass"] > 0) == (mode == "output")
        losses[mode] = np.asarray(eager)
    np.testing.assert_allclose(losses["output"], losses["epilog"], rtol=5e-3)
    assert losses["output"][-1] < losses["output"][0]
