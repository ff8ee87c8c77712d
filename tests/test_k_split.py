"""The CUDA backend's own K split (``CudaBackend.k_splits``): one strided-batched cuBLASLt
matmul writes the K slices' partial products, and fuseflow's epilog pass adds them in split
order as it runs bias + ReLU + relu_aux (forward) or the ReLU mask + bias gradient (input
gradient). Checked against the NumPy reference: bit for bit on small integers (every sum
exact whatever its order), within float32 rounding on normal draws, deterministic, and
left unsplit where K does not divide into 16-byte slices or the dtype is float16.

GPU only (skipped without one), like ``test_gpu_backend.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import fuseflow.backend as fb
from fuseflow.backend.epilogs import DGRAD_EPILOGS, EPILOGS
from fuseflow.backend.numpy_backend import NumpyBackend, pack_relu_aux

if not fb.cuda_available():
    pytest.skip("needs CuPy, nvmath-python and an NVIDIA GPU", allow_module_level=True)

import cupy  # noqa: E402

from fuseflow.backend.cuda_backend import CudaBackend  # noqa: E402

pytestmark = pytest.mark.gpu

FORWARD = [n for n, e in EPILOGS.items() if e.activation in (None, "relu") and n != "DEFAULT"]
DGRAD = [n for n, e in DGRAD_EPILOGS.items() if e.activation == "relu"]
SPLITS = [2, 3, 4, 7]


def backend(splits):
    """Plain cuBLASLt matmuls + the own epilogs at every size, K split ``splits`` ways."""
    be = CudaBackend(tf32=False, autotune=False)
    be.own_epilog, be.own_epilog_min = "all", 0
    be.skinny_max = 0
    be.own_gemm_max_macs = 0
    be.k_splits = splits
    return be


def ints(rng, shape, dtype):
    return rng.integers(-3, 4, shape).astype(dtype)


@pytest.mark.parametrize("splits", SPLITS)
@pytest.mark.parametrize("epilog", FORWARD)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_forward_exact_on_integers(rng, dtype, epilog, splits):
    batch, k, features = 37, 20 * splits, 24           # slices of 20: a multiple of 4
    x, w, b = ints(rng, (batch, k), dtype), ints(rng, (features, k), dtype), \
        ints(rng, (features,), dtype)
    spec = EPILOGS[epilog]
    bias = b if spec.bias else None
    be = backend(splits)
    y, aux = be.linear(cupy.asarray(x), cupy.asarray(w),
                       None if bias is None else cupy.asarray(bias), epilog)
    y_ref, aux_ref = NumpyBackend().linear(x, w, bias, epilog)
    assert be.stats()["k_split"] == 1, f"the split path did not run (seed {rng.seed})"
    assert be.stats()["copies"] == {}          # slices are views, partials come out C order
    assert y.dtype == dtype and y.flags.c_contiguous
    np.testing.assert_array_equal(cupy.asnumpy(y), y_ref, err_msg=f"seed {rng.seed}")
    if spec.aux:
        np.testing.assert_array_equal(cupy.asnumpy(aux), aux_ref, err_msg=f"seed {rng.seed}")
    else:
        assert aux is None


@pytest.mark.parametrize("splits", SPLITS)
@pytest.mark.parametrize("epilog", DGRAD)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_dgrad_exact_on_integers(rng, dtype, epilog, splits):
    batch, fin, fout = 45, 40, 12 * splits             # K = fout, slices of 12
    dy, w = ints(rng, (batch, fout), dtype), ints(rng, (fout, fin), dtype)
    pre = ints(rng, (batch, fin), dtype)               # its zeros: the gradient passes
    aux_ref = pack_relu_aux(pre)
    be = backend(splits)
    _, aux = be.activation(cupy.asarray(pre), "relu")
    dx, db = be.linear_dgrad(cupy.asarray(dy), cupy.asarray(w), epilog, aux)
    dx_ref, db_ref = NumpyBackend().linear_dgrad(dy, w, epilog, aux_ref)
    assert be.stats()["k_split"] == 1, f"the split path did not run (seed {rng.seed})"
    assert be.stats()["copies"] == {}
    np.testing.assert_array_equal(cupy.asnumpy(dx), dx_ref, err_msg=f"seed {rng.seed}")
    if DGRAD_EPILOGS[epilog].bias:
        np.testing.assert_array_equal(cupy.asnumpy(db), db_ref, err_msg=f"seed {rng.seed}")
    else:
        assert db is None


@pytest.mark.parametrize("splits", [4, 7])
def test_medium_layer_close_to_float64_and_deterministic(rng, splits):
    """The medium model's layer 1 (K = 784: 4 or 7 slices) on normal draws: within float32
    rounding of the float64 product, and the same bits on a second run."""
    batch, k, features = 256, 784, 1024
    x = np.maximum(rng.standard_normal((batch, k)), 0).astype(np.float32)
    w = (rng.standard_normal((features, k)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(features).astype(np.float32)
    be = backend(splits)
    args = (cupy.asarray(x), cupy.asarray(w), cupy.asarray(b), "RELU_AUX_BIAS")
    y1, aux1 = be.linear(*args)
    y2, aux2 = be.linear(*args)
    assert be.stats()["k_split"] == 2
    pre = x.astype(np.float64) @ w.T.astype(np.float64) + b
    ref = np.maximum(pre, 0)
    err = np.linalg.norm(cupy.asnumpy(y1) - ref) / np.linalg.norm(pre)
    assert err < 1e-6, f"relative error {err:.3g} (seed {rng.seed})"
    assert (cupy.asnumpy(y1) == cupy.asnumpy(y2)).all()
    assert (cupy.asnumpy(aux1) == cupy.asnumpy(aux2)).all()
    # the mask agrees with the float64 signs away from rounding-size pre-activations
    bits = np.unpackbits(cupy.asnumpy(aux1).T, axis=1, bitorder="little")[:, :features]
    clear = np.abs(pre) > 1e-4
    assert (bits.astype(bool)[clear] == (pre >= 0)[clear]).all(), f"seed {rng.seed}"


@pytest.mark.parametrize("k, dtype", [(30, np.float32), (40, np.float32), (64, np.float16)],
                         ids=["K=30", "slice of 10", "float16"])
def test_unsplittable_cases_run_unsplit(rng, k, dtype):
    """K not divisible by the splits, slices not a multiple of 4 elements, or float16 (its
    partial products would be rounded to 16 bits): the ordinary path, the same results."""
    x, w, b = ints(rng, (33, k), dtype), ints(rng, (16, k), dtype), ints(rng, (16,), dtype)
    be = backend(4)
    y, aux = be.linear(cupy.asarray(x), cupy.asarray(w), cupy.asarray(b), "RELU_AUX_BIAS")
    assert be.stats()["k_split"] == 0
    y_ref, aux_ref = NumpyBackend().linear(x, w, b, "RELU_AUX_BIAS")
    np.testing.assert_array_equal(cupy.asnumpy(y), y_ref)
    np.testing.assert_array_equal(cupy.asnumpy(aux), aux_ref)


def test_default_settings_split_the_medium_models_layers(rng):
    """With the backend's defaults (own epilogs from 2^18 outputs, ``k_splits="auto"``) the
    medium model's layer 1 forward (K = 784) and layer 2 input gradient (K = 1024) take the
    split path, and agree with float64 within float32 rounding."""
    be = CudaBackend(tf32=False, autotune=False)
    assert be.k_splits == "auto"
    x = np.maximum(rng.standard_normal((256, 784)), 0).astype(np.float32)
    w1 = (rng.standard_normal((1024, 784)) / 28).astype(np.float32)
    b1 = rng.standard_normal(1024).astype(np.float32)
    dy = rng.standard_normal((256, 1024)).astype(np.float32)
    w2 = (rng.standard_normal((1024, 1024)) / 32).astype(np.float32)
    h, aux = be.linear(cupy.asarray(x), cupy.asarray(w1), cupy.asarray(b1), "RELU_AUX_BIAS")
    dx, db = be.linear_dgrad(cupy.asarray(dy), cupy.asarray(w2), "DRELU_BGRAD", aux)
    assert be.stats()["k_split"] == 2, be.stats()
    pre = x.astype(np.float64) @ w1.T.astype(np.float64) + b1
    mask = cupy.asnumpy(h) > 0                       # the mask the GPU used
    prod = dy.astype(np.float64) @ w2.astype(np.float64)
    for what, got, ref, scale in (("y", h, np.maximum(pre, 0), pre),
                                  ("dx", dx, prod * mask, prod),
                                  ("dbias", db, (prod * mask).sum(0), np.abs(prod * mask))):
        err = np.linalg.norm(cupy.asnumpy(got) - ref) / np.linalg.norm(scale)
        assert err < 1e-6, f"{what}: relative error {err:.3g} (seed {rng.seed})"
