"""The NumPy backend's epilogs where test_numpy_backend does not go: float32/float16
operands, non-contiguous (transposed) operands, the standalone activations and their
relu_aux round trip, on fresh random inputs (``rng``). Reference: the float64 formulas of
tests/reference.py on the same rounded operands, with tolerances for the one rounding to
the operand dtype (float16 accumulates in float32).
"""

import numpy as np
import pytest

from fuseflow.backend import get
from fuseflow.backend.epilogs import DGRAD_EPILOGS, EPILOGS, relu_aux_rows
from tests import reference as ref

be = get("numpy")
LOW = pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)


def f64(a):
    return a.astype(np.float64)


@pytest.mark.parametrize("epilog", sorted(EPILOGS))
@LOW
@pytest.mark.parametrize("batch,features,inp", [(1, 1, 1), (1, 17, 3), (3, 33, 17)])
def test_forward_epilogs_low_precision_non_contiguous(rng, epilog, dtype, batch, features, inp):
    """Near-zero pre-activations (|pre| <= 1e-2) may round to either side of the ReLU: their
    outputs and relu_aux bits are not compared."""
    spec = EPILOGS[epilog]
    x = rng.standard_normal((inp, batch)).astype(dtype).T     # non-contiguous
    w = rng.standard_normal((inp, features)).astype(dtype).T  # non-contiguous
    b = rng.standard_normal(features).astype(dtype) if spec.bias else None
    y, aux = be.linear(x, w, b, epilog)
    pre = f64(x) @ f64(w).T + (f64(b) if spec.bias else 0)
    assert y.dtype == dtype and y.shape == (batch, features)
    tol = 1e-2 if dtype == np.float16 else 1e-5
    ok = np.abs(pre) > 1e-2 if spec.activation == "relu" else np.ones(pre.shape, bool)
    want = ref.ACT[spec.activation][0](pre)
    ref.close(np.where(ok, y, 0), np.where(ok, want, 0), tol, tol, "y", rng.seed)
    if spec.aux and spec.activation == "relu":
        bits = ref.relu_aux_bits(aux, features, batch)
        np.testing.assert_array_equal(bits[ok], ref.relu_mask(pre)[ok],
                                      err_msg=f"relu_aux (seed {rng.seed})")
    elif spec.aux:
        assert aux.dtype == dtype and aux.shape == (features, batch)
        ref.close(aux.T, pre, tol, tol, "gelu_aux", rng.seed)


@pytest.mark.parametrize("epilog", sorted(DGRAD_EPILOGS))
@LOW
def test_dgrad_epilogs_low_precision_vs_float64(rng, epilog, dtype):
    spec = DGRAD_EPILOGS[epilog]
    batch, features, out = 5, 33, 17
    pre = rng.standard_normal((batch, features)).astype(dtype)
    pre[0, ::3] = 0  # exact zeros: the gradient passes
    dy = rng.standard_normal((batch, out)).astype(dtype)
    w = rng.standard_normal((out, features)).astype(dtype)
    aux = be.activation(pre, spec.activation)[1] if spec.activation else None
    dx, db = be.linear_dgrad(dy, w, epilog, aux)
    want = (f64(dy) @ f64(w)) * ref.ACT[spec.activation][1](f64(pre))
    tol = 2e-3 if dtype == np.float16 else 1e-5
    ref.close(dx, want, tol, tol * 10, "dx", rng.seed)
    if spec.bias:
        ref.close(db, want.sum(0), tol * 5, tol * 50, "dbias", rng.seed)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("batch,features", [(1, 1), (1, 3), (2, 17), (3, 33), (2, 129)])
def test_standalone_activation_epilogs_and_relu_aux_round_trip(rng, dtype, batch, features):
    x = rng.standard_normal((features, batch)).astype(dtype).T  # non-contiguous
    x[0, ::2] = 0
    y, aux = be.activation(x, "relu")
    np.testing.assert_array_equal(y, np.where(ref.relu_mask(x), x, 0).astype(dtype))
    assert aux.shape == (relu_aux_rows(features), batch) and aux.dtype == np.uint8
    np.testing.assert_array_equal(ref.relu_aux_bits(aux, features, batch), ref.relu_mask(x))
    assert not aux[-(-features // 8):].any()  # the padding bytes are zero on the host
    dy = rng.standard_normal((batch, features)).astype(dtype)
    np.testing.assert_array_equal(be.activation_grad(dy, "relu", aux),
                                  np.where(ref.relu_mask(x), dy, 0))
    yg, auxg = be.activation(x, "gelu")
    # the tanh form loses digits for x < -3 (1 + tanh(u) cancels): ~1e-6 absolute in float32
    tol = {np.float16: 2e-3, np.float32: 5e-6, np.float64: 1e-12}[dtype]
    ref.close(yg, ref.gelu(f64(x)), tol, tol, "gelu", rng.seed)
    ref.close(be.activation_grad(dy, "gelu", auxg), f64(dy) * ref.gelu_grad(f64(x)),
              tol, tol * 4, "gelu grad", rng.seed)
    ref.close(be.bias_grad(dy), f64(dy).sum(0), tol, tol, "bias grad", rng.seed)


@LOW
def test_wgrad_epilogs_low_precision(rng, dtype):
    dy = rng.standard_normal((7, 17)).astype(dtype)
    x = rng.standard_normal((33, 7)).astype(dtype).T  # non-contiguous
    dw, db = be.linear_wgrad(dy, x, "BGRADB")
    tol = 5e-3 if dtype == np.float16 else 1e-5
    assert dw.dtype == dtype and db.dtype == dtype
    ref.close(dw, f64(dy).T @ f64(x), tol, tol * 10, "dw", rng.seed)
    ref.close(db, f64(dy).sum(0), tol, tol * 10, "dbias", rng.seed)
