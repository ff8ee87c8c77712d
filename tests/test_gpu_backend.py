"""The CUDA backend (CuPy + nvmath-python cuBLASLt epilogs) against the NumPy reference.

Every test needs an NVIDIA GPU with CuPy and nvmath-python; without them the whole module is
skipped (CI has no GPU). Run on a GPU machine with ``pytest -m gpu`` (or
``benchmarks/gpu_run.sh``).

Inputs are fresh random draws each run; the seed is in every failure message (and in the
junit properties) so a failure can be replayed with ``FUSEFLOW_TEST_SEED``.
"""

from __future__ import annotations

import itertools
import os

import ml_dtypes
import numpy as np
import pytest

import fuseflow.backend as fb
from fuseflow.backend import BackendError
from fuseflow.backend.epilogs import DGRAD_EPILOGS, EPILOGS, WGRAD_EPILOGS, relu_aux_rows
from fuseflow.backend.numpy_backend import NumpyBackend, pack_relu_aux, unpack_relu_aux
from tests.reference import rel_err

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX must not take the GPU

cupy = pytest.importorskip("cupy")
pytest.importorskip("nvmath")
try:
    _NDEV = cupy.cuda.runtime.getDeviceCount()
except Exception:  # noqa: BLE001 - CuPy without a driver or a device
    _NDEV = 0
if _NDEV < 1:
    pytest.skip("no CUDA GPU visible", allow_module_level=True)

_cuda = pytest.importorskip("fuseflow.backend.cuda_backend")
CudaBackend, GPUOutOfMemoryError = _cuda.CudaBackend, _cuda.GPUOutOfMemoryError
CUPY_BF16 = _cuda._BFLOAT16

pytestmark = pytest.mark.gpu

DTYPES = [np.float16, np.float32, np.float64]
#: bfloat16 as well (CuPy 14): 8 mantissa bits to float16's 11, hence its wider bounds
BF16 = ml_dtypes.bfloat16
ALL_DTYPES = [*DTYPES, BF16] if CUPY_BF16 else DTYPES
HALVES = [np.float16, BF16] if CUPY_BF16 else [np.float16]
TOL = {np.float16: 1e-2, np.float32: 1e-5, np.float64: 1e-12, BF16: 3e-2}
# cuBLASLt's GELU epilogs (GELU*, DGELU*) approximate the tanh-GELU: measured on an H200
# (cuBLASLt 13.1) up to 5.2e-10 relative (norm) in float64 and 1.02e-5 in float32 against the
# exact formula, so fused GELU results get these bounds; see test_cublaslt_gelu_accuracy.
GELU_EPILOG_TOL = {np.float16: 1e-2, np.float32: 5e-5, np.float64: 5e-9, BF16: 3e-2}
# |pre-activation| under which GPU and CPU may round to different signs (random inputs only)
SIGN_MARGIN = {np.float16: 5e-2, np.float32: 1e-4, np.float64: 1e-10, BF16: 4e-1}
# (batch, in, out): typical, batch 1, K == 1 forward, wide, out == 1 (K == 1 in dgrad), tiny,
# batches the skinny kernels split into chunks summed in a second pass (out <= 32), and
# whole aux bytes on both sides (fuseflow's own epilogs: in and out multiples of 8)
SHAPES = [(64, 48, 96), (1, 17, 37), (7, 1, 13), (33, 20, 1000), (5, 9, 1), (16, 3, 8),
          (600, 300, 10), (1000, 32, 32), (2100, 24, 7), (96, 40, 64)]


# ---- helpers ---------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["skinny", "cublaslt", "own_epilog", "tt"])
def cb(request):
    """Every implementation of the dense matmuls: fuseflow's skinny kernels (the default for
    <= 32 features), cuBLASLt's epilogs (skinny_max = 0), and plain cuBLASLt matmuls plus
    fuseflow's in-place bias/ReLU/GELU epilogs in every dtype and size (full float32 uses them
    from ``own_epilog_min`` on); "tt": the last with the plain input gradients (more than 32
    output features) handed to cuBLASLt as ``dy @ w`` (``dgrad_orientation``). The opt-in
    own float32 matmul stays off here (``test_own_gemm.py``)."""
    be = CudaBackend(tf32=False, autotune=False)
    if request.param == "cublaslt":
        be.skinny_max = 0
        be.own_epilog = "off"
        be.own_gemm_max_macs = 0
    if request.param in ("own_epilog", "tt"):
        be.own_epilog, be.own_epilog_min = "all", 0
        be.own_gemm_max_macs = 0
    if request.param == "tt":
        be.dgrad_orientation = "tt"
    return be


@pytest.fixture(scope="module")
def nb():
    return NumpyBackend()


def dev(a):
    return None if a is None else cupy.asarray(a)


def host(a):
    return None if a is None else cupy.asnumpy(a)


def check_close(what, got, ref, dtype, seed, tol=None, scale=None):
    """‖got - ref‖ / ‖ref‖ <= tol. With ``scale`` (the pre-activation, the product before
    masking, or the terms of a bias gradient's column sums) the denominator is max(‖ref‖,
    ‖scale‖): a ReLU that zeroes all but a few tiny outputs, or a sum that cancels, must not
    turn rounding at the larger magnitude into a large ratio."""
    tol = TOL[dtype] if tol is None else tol[dtype]
    got = host(got)
    err = rel_err(got, ref)
    if scale is not None:
        den = np.linalg.norm(np.asarray(ref, dtype=np.float64))
        err = err * den / max(den, np.linalg.norm(scale)) if den > 0 else \
            np.linalg.norm(got.astype(np.float64) - ref) / max(np.linalg.norm(scale), 1e-300)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol} (seed {seed})"


def normal(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def ints(rng, shape, dtype, lo=-2, hi=2):
    return rng.integers(lo, hi + 1, shape).astype(dtype)


def check_relu_aux_layout(aux, features, batch):
    rows = relu_aux_rows(features)
    assert isinstance(aux, cupy.ndarray)
    assert aux.dtype == np.uint8 and aux.shape == (rows, batch)
    assert aux.strides[0] == 1 and (batch == 1 or aux.strides[1] == rows), aux.strides


# ---- forward ---------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("epilog", sorted(EPILOGS))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_forward_matches_numpy(cb, nb, rng, dtype, epilog, shape):
    batch, fin, fout = shape
    spec = EPILOGS[epilog]
    x = normal(rng, (batch, fin), dtype)
    w = normal(rng, (fout, fin), dtype, 1 / np.sqrt(fin))
    b = normal(rng, (fout,), dtype) if spec.bias else None
    y_ref, aux_ref = nb.linear(x, w, b, epilog)
    y, aux = cb.linear(dev(x), dev(w), dev(b), epilog)

    assert isinstance(y, cupy.ndarray) and y.dtype == dtype and y.shape == (batch, fout)
    assert y.flags.c_contiguous
    pre = x.astype(np.float64) @ w.T.astype(np.float64)
    if b is not None:
        pre += b
    gelu_tol = GELU_EPILOG_TOL if spec.activation == "gelu" else None
    check_close(f"y ({epilog})", y, y_ref, dtype, rng.seed, gelu_tol, scale=pre)
    if not spec.aux:
        assert aux is None
        return
    if spec.activation == "relu":
        check_relu_aux_layout(aux, fout, batch)
        safe = np.abs(pre) > SIGN_MARGIN[dtype]
        bits, bits_ref = unpack_relu_aux(host(aux), fout), unpack_relu_aux(aux_ref, fout)
        bad = int(((bits != bits_ref) & safe).sum())
        assert bad == 0, f"{bad} relu_aux bits differ (seed {rng.seed})"
    else:
        assert aux.shape == (fout, batch) and aux.dtype == dtype
        check_close(f"gelu_aux ({epilog})", aux, aux_ref, dtype, rng.seed)


@pytest.mark.parametrize("features", [*range(1, 38), 1000])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_relu_aux_bits_identical_with_exact_zeros(cb, nb, rng, dtype, features):
    """Integer-valued inputs make every pre-activation exact on both sides (many exactly 0):
    y, relu_aux (bits of rows < F), the DRELU(_BGRAD) gradient and its bias gradient must all
    be identical, fused and standalone."""
    batch, fin, fout2 = 19, 11, 5
    x = ints(rng, (batch, fin), dtype)
    x[::4] = 0                                   # zero samples: pre == bias
    w = ints(rng, (features, fin), dtype)
    b = ints(rng, (features,), dtype)
    b[::3] = 0                                   # ... and zero bias entries: pre == 0 exactly
    pre = x.astype(np.float64) @ w.T.astype(np.float64) + b
    assert (pre == 0).any()

    for epilog in ("RELU_AUX_BIAS", "RELU_AUX"):
        bias = b if EPILOGS[epilog].bias else None
        y_ref, aux_ref = nb.linear(x, w, bias, epilog)
        y, aux = cb.linear(dev(x), dev(w), dev(bias), epilog)
        check_relu_aux_layout(aux, features, batch)
        np.testing.assert_array_equal(host(y), y_ref, err_msg=f"{epilog} y (seed {rng.seed})")
        np.testing.assert_array_equal(unpack_relu_aux(host(aux), features),
                                      unpack_relu_aux(aux_ref, features),
                                      err_msg=f"{epilog} relu_aux bits (seed {rng.seed})")

    # standalone kernel on the same pre-activation: same bits, zero padding bytes
    pre_c = pre.astype(dtype)
    y2, aux2 = cb.activation(dev(pre_c), "relu")
    check_relu_aux_layout(aux2, features, batch)
    np.testing.assert_array_equal(host(y2), np.maximum(pre_c, 0))
    np.testing.assert_array_equal(host(aux2), pack_relu_aux(pre_c))  # padding written as 0

    # backward through the next layer (K = fout2 > 1, fused) with the GPU-made aux
    w2 = ints(rng, (fout2, features), dtype)
    dz = ints(rng, (batch, fout2), dtype)
    _, aux_ref = nb.linear(x, w, b, "RELU_AUX_BIAS")
    _, aux = cb.linear(dev(x), dev(w), dev(b), "RELU_AUX_BIAS")
    for epilog in ("DRELU", "DRELU_BGRAD"):
        dh_ref, db_ref = nb.linear_dgrad(dz, w2, epilog, aux_ref)
        dh, db = cb.linear_dgrad(dev(dz), dev(w2), epilog, aux)
        np.testing.assert_array_equal(host(dh), dh_ref, err_msg=f"{epilog} dx (seed {rng.seed})")
        if db_ref is None:
            assert db is None
        else:
            np.testing.assert_array_equal(host(db), db_ref,
                                          err_msg=f"{epilog} dbias (seed {rng.seed})")
        dh3 = cb.activation_grad(dev(dz @ w2 if np.dtype(dtype).itemsize > 2 else
                                     (dz.astype(np.float32) @ w2.astype(np.float32))
                                     .astype(dtype)), "relu", aux)
        np.testing.assert_array_equal(host(dh3), dh_ref, err_msg="activation_grad relu")


# ---- input gradient --------------------------------------------------------------------------
def _lower_aux(cb, rng, activation, batch, features, dtype):
    """(aux_ref numpy, aux_gpu made by the GPU, aux_host_copy) for a lower layer."""
    pre = normal(rng, (batch, features), dtype)
    pre[:, ::4] = 0                              # exact zeros: the gradient passes at 0
    if activation == "relu":
        aux_ref = pack_relu_aux(pre)
        _, aux_gpu = cb.activation(dev(pre), "relu")
    else:
        aux_ref = pre.T
        aux_gpu = dev(pre).T
    return aux_ref, aux_gpu, dev(aux_ref)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("epilog", sorted(DGRAD_EPILOGS))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_dgrad_matches_numpy(cb, nb, rng, dtype, epilog, shape):
    batch, fin, fout = shape                     # this layer: w (fout, fin); aux: fin features
    spec = DGRAD_EPILOGS[epilog]
    dy = normal(rng, (batch, fout), dtype)
    w = normal(rng, (fout, fin), dtype, 1 / np.sqrt(fout))
    auxes = [(None, None)]
    if spec.aux:
        aux_ref, aux_gpu, aux_host_made = _lower_aux(cb, rng, spec.activation, batch, fin, dtype)
        auxes = [(aux_ref, aux_gpu), (aux_ref, aux_host_made)]
    before = dict(cb.stats()["fallbacks"])
    for aux_ref, aux in auxes:
        dx_ref, db_ref = nb.linear_dgrad(dy, w, epilog, aux_ref)
        dx, db = cb.linear_dgrad(dev(dy), dev(w), epilog, aux)
        assert isinstance(dx, cupy.ndarray) and dx.shape == (batch, fin) and dx.dtype == dtype
        assert dx.flags.c_contiguous
        # the K == 1 fallback runs fuseflow's own GELU kernel (numpy's formula): exact bounds
        gelu_tol = GELU_EPILOG_TOL if spec.activation == "gelu" and fout > 1 else None
        product = dy.astype(np.float64) @ w.astype(np.float64)   # before the mask
        check_close(f"dx ({epilog})", dx, dx_ref, dtype, rng.seed, gelu_tol, scale=product)
        if spec.bias:
            assert db.shape == (fin,) and db.dtype == dtype
            # a column sum that cancels is judged at its terms' size, as dx at the product's
            check_close(f"dbias ({epilog})", db, db_ref, dtype, rng.seed, gelu_tol,
                        scale=dx_ref)
        else:
            assert db is None
    cublaslt = cb.skinny_max == 0 or spec.activation == "gelu"
    if spec.aux and fout == 1 and cublaslt:      # K == 1: the transparent unfused path ran
        after = cb.stats()["fallbacks"]
        key = f"dgrad/{epilog}: K == 1"
        assert after.get(key, 0) > before.get(key, 0)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("epilog", sorted(WGRAD_EPILOGS))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_wgrad_matches_numpy(cb, nb, rng, dtype, epilog, shape):
    batch, fin, fout = shape
    dy = normal(rng, (batch, fout), dtype)
    x = normal(rng, (batch, fin), dtype)
    dw_ref, db_ref = nb.linear_wgrad(dy, x, epilog)
    dw, db = cb.linear_wgrad(dev(dy), dev(x), epilog)
    assert dw.shape == (fout, fin) and dw.dtype == dtype and dw.flags.c_contiguous
    check_close(f"dw ({epilog})", dw, dw_ref, dtype, rng.seed)
    if WGRAD_EPILOGS[epilog].bias:
        assert db.shape == (fout,) and db.dtype == dtype
        check_close(f"dbias ({epilog})", db, db_ref, dtype, rng.seed, scale=dy)
    else:
        assert db is None


@pytest.mark.parametrize("batch", [1, 7, 1024, 1025, 5000])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("classes", [1, 10, 32, 40])
def test_fused_softmax_xent_matches_numpy(nb, rng, dtype, batch, classes):
    """The one-launch loss kernel (one block up to 1024 rows, per-block partial sums past
    that; the class count compiled in up to 32, a loop past that) against the NumPy
    reference, value and gradient, with int32 and int64 labels."""
    cb = CudaBackend(tf32=False)
    logits = normal(rng, (batch, classes), dtype, 3.0)
    for label_dtype in (np.int64, np.int32):
        labels = rng.integers(0, classes, batch).astype(label_dtype)
        loss_ref, grad_ref = nb.softmax_cross_entropy(logits, labels)
        loss, grad = cb.softmax_cross_entropy(dev(logits), dev(labels))
        assert grad.dtype == dtype and grad.shape == logits.shape
        check_close("loss", loss, np.asarray(loss_ref), np.float64 if dtype == np.float64
                    else np.float32, rng.seed)
        check_close("dlogits", grad, grad_ref, dtype, rng.seed)


@pytest.mark.parametrize("batch", [7, 1025])
@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=lambda d: np.dtype(d).name)
def test_scaled_softmax_xent_equals_the_unfused_composition(nb, rng, dtype, batch):
    """Mixed precision's loss gradient from the loss kernel itself (grad_scale, grad_dtype):
    bit for bit the float32 kernel's gradient of the float32-cast logits, times the scale
    in float32, cast to the 16-bit dtype (the three launches it replaces); the NumPy
    reference computes that composition too."""
    import cupy

    cb = CudaBackend(tf32=False)
    logits = normal(rng, (batch, 10), dtype, 3.0)
    labels = rng.integers(0, 10, batch).astype(np.int64)
    scale = cupy.asarray(2.0 ** 13, dtype=cupy.float32)
    loss32, g32 = cb.softmax_cross_entropy(dev(logits).astype(np.float32), dev(labels))
    want = (g32 * scale).astype(np.float16)
    loss, got = cb.softmax_cross_entropy(dev(logits), dev(labels), scale, np.float16)
    assert got.dtype == np.float16 and got.shape == logits.shape
    np.testing.assert_array_equal(cupy.asnumpy(got), cupy.asnumpy(want))
    assert float(loss) == float(loss32)
    loss_ref, g_ref = nb.softmax_cross_entropy(logits, labels, np.float32(2.0 ** 13),
                                               np.float16)
    assert g_ref.dtype == np.float16
    check_close("scaled dlogits", got, g_ref, np.float16, rng.seed)


def test_mixed_precision_loss_gradient_in_the_loss_kernel(rng, monkeypatch):
    """``ff.mixed_precision.value_and_grad`` with softmax_cross_entropy asks the loss for
    its scaled float16 gradient (one launch); a loss without those keywords runs the cast,
    multiply and cast. Same loss and same grads, bit for bit. (The output layer's fused
    kernel is off here: it adds the loss in another order, see test_gpu_head.py.)"""
    import cupy

    import fuseflow as ff
    from fuseflow import mixed_precision as mp

    model = ff.nn.Serial(ff.nn.Dense(64, activation="relu"), ff.nn.Dense(10))
    _, params = model.init(ff.random.key(3), (20,))
    params = ff.device_put(params, "cuda")
    x = dev(normal(rng, (300, 20), np.float32))
    y = dev(rng.integers(0, 10, 300).astype(np.int64))
    scale = cupy.asarray(2.0 ** 12, dtype=cupy.float32)

    def plain(logits, labels):
        return ff.losses.softmax_cross_entropy(logits, labels)

    assert mp._takes_grad_scale(ff.losses.softmax_cross_entropy)
    assert not mp._takes_grad_scale(plain)
    be = ff.backend.get("cuda")
    monkeypatch.setattr(be, "fused_head", False)
    be.reset_stats()
    fused = mp.value_and_grad(model, ff.losses.softmax_cross_entropy, unscaled=False)
    loss_a, grads_a = fused(params, x, y, loss_scale=scale)
    loss_b, grads_b = mp.value_and_grad(model, plain, unscaled=False)(params, x, y,
                                                                       loss_scale=scale)
    assert float(loss_a) == float(loss_b)
    for a, b in zip(ff.tree.leaves(grads_a), ff.tree.leaves(grads_b)):
        assert a.dtype == np.float16
        np.testing.assert_array_equal(cupy.asnumpy(a), cupy.asnumpy(b))


def test_skinny_kernels_take_the_small_side_and_only_it(nb, rng):
    """Forward/wgrad with <= 32 outputs and dgrad with <= 32 gradient columns run the skinny
    kernels (counted); GELU input gradients and wider layers run cuBLASLt (or the own
    epilog pass). A 40-unit ReLU layer (cuBLASLt) under a 32-unit one (skinny): its mask
    goes into the skinny dgrad; a 32-unit GELU forward is skinny, its gelu_aux in cuBLASLt's
    padded layout; all match NumPy."""
    cb = CudaBackend(tf32=False)
    x = normal(rng, (300, 50), np.float32)
    w0, b0 = normal(rng, (40, 50), np.float32, 0.2), normal(rng, (40,), np.float32)
    w1, b1 = normal(rng, (32, 40), np.float32, 0.2), normal(rng, (32,), np.float32)
    n0 = cb.stats()["skinny"]
    h, aux = cb.linear(dev(x), dev(w0), dev(b0), "RELU_AUX_BIAS")     # 40 outputs: cuBLASLt
    hg, gaux = cb.linear(dev(x), dev(w0), dev(b0), "GELU_AUX_BIAS")   # 40 outputs: cuBLASLt
    dyg = normal(rng, (300, 32), np.float32)
    dxg, dbg = cb.linear_dgrad(dev(dyg), dev(w1), "DGELU_BGRAD", gaux)  # GELU: not skinny
    assert cb.stats()["skinny"] == n0
    dxg_ref, dbg_ref = nb.linear_dgrad(dyg, w1, "DGELU_BGRAD", host(gaux))
    check_close("dxg", dxg, dxg_ref, np.float32, rng.seed, GELU_EPILOG_TOL)
    check_close("dbg", dbg, dbg_ref, np.float32, rng.seed, GELU_EPILOG_TOL, scale=dxg_ref)
    wg = normal(rng, (30, 50), np.float32, 0.2)
    g, gaux30 = cb.linear(dev(x), dev(wg), dev(b1[:30]), "GELU_AUX_BIAS")  # 30: skinny
    assert cb.stats()["skinny"] == n0 + 1
    assert gaux30.shape == (30, 300) and gaux30.strides == (4, 32 * 4)  # round_up(30, 8) apart
    padded = cupy.ndarray((32, 300), dtype=gaux30.dtype, memptr=gaux30.data,
                          strides=gaux30.strides)
    assert not host(padded[30:]).any()  # the padding rows are zeros
    g_ref, gaux_ref = nb.linear(x, wg, b1[:30], "GELU_AUX_BIAS")
    check_close("g", g, g_ref, np.float32, rng.seed)
    check_close("gelu_aux", gaux30, gaux_ref, np.float32, rng.seed)
    n0 = cb.stats()["skinny"]
    y, aux1 = cb.linear(h, dev(w1), dev(b1), "RELU_AUX_BIAS")         # 32 outputs: skinny
    dy = normal(rng, (300, 32), np.float32)
    dw, db1 = cb.linear_wgrad(dev(dy), h, "BGRADB")                    # 32 outputs: skinny
    dx, db0 = cb.linear_dgrad(dev(dy), dev(w1), "DRELU_BGRAD", aux)    # K = 32: skinny
    assert cb.stats()["skinny"] == n0 + 3
    h_ref, aux_ref = nb.linear(x, w0, b0, "RELU_AUX_BIAS")
    y_ref, _ = nb.linear(h_ref, w1, b1, "RELU_AUX_BIAS")
    check_close("y", y, y_ref, np.float32, rng.seed)
    dw_ref, db1_ref = nb.linear_wgrad(dy, h_ref, "BGRADB")
    check_close("dw", dw, dw_ref, np.float32, rng.seed)
    check_close("db1", db1, db1_ref, np.float32, rng.seed)
    dx_ref, db0_ref = nb.linear_dgrad(dy, w1, "DRELU_BGRAD", host(aux))
    check_close("dx", dx, dx_ref, np.float32, rng.seed)
    check_close("db0", db0, db0_ref, np.float32, rng.seed)


# (batch, in, out): 16-byte vectors (V = 8 in float16, 4 in float32, 2 in float64), a width
# that V does not divide (1028: V = 4 in float16), one chunk, and an odd width (V = 1)
VECTOR_SHAPES = [(700, 520, 10), (300, 1028, 7), (33, 64, 32), (257, 999, 10)]
# V of each shape: float16 / float32 / float64 (the N x V sums must fit the registers: two
# columns for 32 outputs; an odd width admits one)
VECTOR_WIDTHS = {(700, 520, 10): (8, 4, 2), (300, 1028, 7): (4, 4, 2), (33, 64, 32): (2, 2, 2),
                 (257, 999, 10): (1, 1, 1)}


@pytest.mark.parametrize("shape", VECTOR_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_skinny_vector_columns_match_numpy(nb, rng, monkeypatch, dtype, shape):
    """The skinny dgrad/wgrad with V columns per thread (used from VECTOR_MIN_ELEMENTS on,
    lowered here to 0) agree with NumPy, masks and bias gradients included."""
    from fuseflow.backend import _cuda_skinny as S

    monkeypatch.setattr(S, "VECTOR_MIN_ELEMENTS", 0)
    cb = CudaBackend(tf32=False)
    batch, fin, fout = shape
    x = normal(rng, (batch, fin), dtype)
    w0, b0 = normal(rng, (fin, fin), dtype, fin ** -0.5), normal(rng, (fin,), dtype)
    h, aux = cb.linear(dev(x), dev(w0), dev(b0), "RELU_AUX_BIAS")
    w1 = normal(rng, (fout, fin), dtype, fin ** -0.5)
    b1 = normal(rng, (fout,), dtype)
    y, aux1 = cb.linear(h, dev(w1), dev(b1), "RELU_AUX_BIAS")
    y_ref, aux1_ref = nb.linear(host(h), w1, b1, "RELU_AUX_BIAS")
    pre = host(h).astype(np.float64) @ w1.T.astype(np.float64) + b1
    check_close("y", y, y_ref, dtype, rng.seed, scale=pre)
    check_relu_aux_layout(aux1, fout, batch)
    bits, bits_ref = unpack_relu_aux(host(aux1), fout), unpack_relu_aux(aux1_ref, fout)
    assert not ((bits != bits_ref) & (np.abs(pre) > SIGN_MARGIN[dtype])).any(), rng.seed
    dy = normal(rng, (batch, fout), dtype)
    assert S._width(fout, dtype, fin, h) == VECTOR_WIDTHS[shape][DTYPES.index(dtype)]
    n0 = cb.stats()["skinny"]
    dw, db1 = cb.linear_wgrad(dev(dy), h, "BGRADB")
    dx, db0 = cb.linear_dgrad(dev(dy), dev(w1), "DRELU_BGRAD", aux)
    assert cb.stats()["skinny"] == n0 + 2
    dw_ref, db1_ref = nb.linear_wgrad(dy, host(h), "BGRADB")
    dx_ref, db0_ref = nb.linear_dgrad(dy, w1, "DRELU_BGRAD", host(aux))
    for name, got, ref in (("dw", dw, dw_ref), ("db1", db1, db1_ref), ("dx", dx, dx_ref),
                           ("db0", db0, db0_ref)):
        check_close(name, got, ref, dtype, rng.seed)


@pytest.mark.parametrize("vector", [False, True], ids=["V=1", "vector"])
@pytest.mark.parametrize("shape", [(700, 520, 10), (300, 784, 30), (257, 999, 10)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_skinny_launch_shapes_match_numpy(nb, rng, monkeypatch, dtype, shape, vector):
    """Every launch shape the skinny kernels can take gives the same sums: one chunk or
    many (second pass), 1 to all outputs per round of the weight gradient's block sums,
    1 to all rows per thread in the input gradient, 1 to 8 samples per forward block."""
    from fuseflow.backend import _cuda_skinny as S

    monkeypatch.setattr(S, "VECTOR_MIN_ELEMENTS", 0 if vector else 2 ** 62)
    cb = CudaBackend(tf32=False)
    batch, fin, fout = shape
    h, aux = cb.activation(dev(normal(rng, (batch, fin), dtype)), "relu")
    aux = cupy.asfortranarray(aux)
    w = normal(rng, (fout, fin), dtype, fin ** -0.5)
    dy = normal(rng, (batch, fout), dtype)
    dw_ref, db_ref = nb.linear_wgrad(dy, host(h), "BGRADB")
    dx_ref, dbx_ref = nb.linear_dgrad(dy, w, "DRELU_BGRAD", host(aux))
    v = S._width(fout, dtype, fin, h) if vector else 1
    staged = 0
    for rows in (8, 64, 256, -(-batch // 8) * 8):
        for per_round in sorted({1, 3, S.outputs_per_round(fout, v, dtype)}):
            dw, db = S.wgrad(dev(dy), h, bgrad=True, rows=rows, per_round=per_round,
                             stage=False)
            check_close(f"dw rows={rows} R={per_round}", dw, dw_ref, dtype, rng.seed)
            check_close(f"db rows={rows} R={per_round}", db, db_ref, dtype, rng.seed)
            # dy through shared memory where it fits: the same sums in the same order
            dw2, db2 = S.wgrad(dev(dy), h, bgrad=True, rows=rows, per_round=per_round)
            assert (host(dw2) == host(dw)).all() and (host(db2) == host(db)).all()
    for rpt in (1, 4, 32, -(-batch // 8)):
        dx, dbx = S.dgrad(dev(dy), dev(w), aux, aux.shape[0], bgrad=True, rpt=rpt,
                          stage=False)
        check_close(f"dx rpt={rpt}", dx, dx_ref, dtype, rng.seed)
        check_close(f"dbx rpt={rpt}", dbx, dbx_ref, dtype, rng.seed)
        dx2, dbx2 = S.dgrad(dev(dy), dev(w), aux, aux.shape[0], bgrad=True, rpt=rpt)
        assert (host(dx2) == host(dx)).all() and (host(dbx2) == host(dbx)).all()
        staged += S.stage_bytes(min(8 * rpt, batch), fout, dtype,
                                S.dgrad_shared_bytes(v, dtype, bgrad=True)) > 0
    assert staged  # the shared-memory path ran
    with pytest.raises(ValueError, match="do not fit in shared memory"):
        S.stage_bytes(10 ** 4, fout, dtype, 0, stage=True)
    b = normal(rng, (fout,), dtype)
    y_ref, aux_ref = nb.linear(host(h), w, b, "RELU_AUX_BIAS")
    pre = host(h).astype(np.float64) @ w.T.astype(np.float64) + b
    rows = relu_aux_rows(fout)
    for spb in (1, 2, 3, 4, 8):  # samples per block; the batches are not all multiples
        y, aux_y = S.forward(h, dev(w), dev(b), relu=True, aux_rows=rows, samples_per_block=spb)
        check_close(f"y spb={spb}", y, y_ref, dtype, rng.seed, scale=pre)
        bits, bits_ref = unpack_relu_aux(host(aux_y), fout), unpack_relu_aux(aux_ref, fout)
        assert not ((bits != bits_ref) & (np.abs(pre) > SIGN_MARGIN[dtype])).any(), spb
    rows8 = -(-fout // 8) * 8  # the GELU form: gelu_aux rows round_up(N, 8) apart
    yg_ref, gaux_ref = nb.linear(host(h), w, b, "GELU_AUX_BIAS")
    for spb in (1, 2, 3, 4, 8):
        y, gaux = S.forward(h, dev(w), dev(b), relu=False, gelu=True, aux_rows=rows8,
                            samples_per_block=spb)
        check_close(f"gelu y spb={spb}", y, yg_ref, dtype, rng.seed, scale=pre)
        check_close(f"gelu_aux spb={spb}", gaux, gaux_ref, dtype, rng.seed, scale=pre)
    with pytest.raises(ValueError, match="samples_per_block=9"):
        S.forward(h, dev(w), dev(b), relu=True, aux_rows=rows, samples_per_block=9)
    with pytest.raises(ValueError, match="per_round=99"):
        S.wgrad(dev(dy), h, bgrad=True, per_round=99)


def test_skinny_vector_columns_at_the_benchmark_shape(nb, rng):
    """The float16 output layer of 784-4096-4096-10 at batch 8192 (V = 8 gradients, chunks
    summed in the second pass) agrees with NumPy in float32."""
    cb = CudaBackend(tf32=False)
    h, aux = cb.activation(dev(normal(rng, (8192, 4096), np.float16)), "relu")
    w = normal(rng, (10, 4096), np.float16, 4096 ** -0.5)
    dy = normal(rng, (8192, 10), np.float16)
    b = normal(rng, (10,), np.float16)
    y, _ = cb.linear(h, dev(w), dev(b), "BIAS")  # cuBLASLt: past FORWARD_MAX_MACS
    y_ref, _ = nb.linear(host(h).astype(np.float32), w.astype(np.float32), b.astype(np.float32),
                         "BIAS")
    check_close("y", y, y_ref, np.float16, rng.seed)
    dw, db = cb.linear_wgrad(dev(dy), h, "BGRADB")
    dx, dbx = cb.linear_dgrad(dev(dy), dev(w), "DRELU_BGRAD", aux)
    f32 = np.float32
    dw_ref, db_ref = nb.linear_wgrad(dy.astype(f32), host(h).astype(f32), "BGRADB")
    dx_ref, dbx_ref = nb.linear_dgrad(dy.astype(f32), w.astype(f32), "DRELU_BGRAD", host(aux))
    for name, got, ref in (("dw", dw, dw_ref), ("db", db, db_ref), ("dx", dx, dx_ref),
                           ("dbx", dbx, dbx_ref)):
        check_close(name, got, ref, np.float16, rng.seed)


# (batch, in, out) of the tensor-core skinny kernels: the benchmark's output layer, a
# width that leaves whole warps idle (320 = 5 x 64), partial row tiles and chunks, one
# output, 16 outputs (no padding), a batch shorter than one row tile
TC_SHAPES = [(8192, 4096, 10), (1000, 320, 16), (300, 192, 1), (257, 2048, 7), (9, 64, 3)]


@pytest.mark.parametrize("f16", HALVES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", TC_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_skinny_tc_kernels_are_exact_on_integers(nb, rng, shape, f16):
    """The tensor-core forward, weight and input gradients (mask, both bias gradients) on
    small integers, whose products and float32 sums are exact: equal to NumPy's float32
    results rounded to the 16-bit dtype (``f16``: float16 or bfloat16), bit for bit, at
    every rows-per-chunk (one chunk writes directly, several go through the second pass).
    Any slip in a fragment or feature mapping moves whole values."""
    from fuseflow.backend import _cuda_skinny_tc as TC

    cb = CudaBackend(tf32=False)
    batch, fin, fout = shape
    f32 = np.float32
    h, aux = cb.activation(dev(ints(rng, (batch, fin), f16)), "relu")
    aux = cupy.asfortranarray(aux)
    w, b = ints(rng, (fout, fin), f16), ints(rng, (fout,), f16)
    dy = ints(rng, (batch, fout), f16)
    hh, w32, dy32 = host(h).astype(f32), w.astype(f32), dy.astype(f32)
    y_ref = (hh @ w32.T + b.astype(f32)).astype(f16)
    dw_ref, db_ref = (x.astype(f16) for x in nb.linear_wgrad(dy32, hh, "BGRADB"))
    dx_ref, _ = nb.linear_dgrad(dy32, w32, "DRELU_BGRAD", host(aux))
    dx_ref = dx_ref.astype(f16)
    dbx_ref = dx_ref.astype(f32).sum(0).astype(f16)  # the sums of the float16 dx
    for got, ref in ((TC.forward(h, dev(w), dev(b))[0], y_ref),
                     (TC.forward(h, dev(w), None)[0], (hh @ w32.T).astype(f16))):
        np.testing.assert_array_equal(host(got), ref, err_msg=f"y (seed {rng.seed})")
    # a relu_aux whose columns are not 8-byte aligned (the kernel then reads a copy)
    odd = cupy.zeros((aux.shape[0] + 3, batch), dtype=np.uint8, order="F")
    odd[:aux.shape[0]] = aux
    # small batches: one chunk at 512; the launch shapes skinny_sweep.py times (warps per
    # block, rows' k16 steps unrolled) beside the default
    launches = [(TC.GRAD_WARPS, TC.GRAD_UNROLL), (8, 1), (8, 4), (4, 4)]
    for rows, (warps, unroll) in itertools.product((16, 48, 256, TC.MAX_ROWS_PER_CHUNK),
                                                   launches):
        dw, db = TC.wgrad(dev(dy), h, bgrad=True, rows=rows, warps=warps, unroll=unroll)
        if rows == 48:
            dx, dbx = TC.dgrad(dev(dy), dev(w), odd[:aux.shape[0]], odd.shape[0], bgrad=True,
                               rows=rows, warps=warps, unroll=unroll)
        else:
            dx, dbx = TC.dgrad(dev(dy), dev(w), aux, aux.shape[0], bgrad=True, rows=rows,
                               warps=warps, unroll=unroll)
        # both gradients from one pass (linear_grads' kernel)
        gw, gb, gx, gbx = TC.grads(dev(dy), h, dev(w), aux, aux.shape[0], bgrad_w=True,
                                   bgrad_x=True, rows=rows, warps=warps, unroll=unroll)
        for name, got, ref in (("dw", dw, dw_ref), ("db", db, db_ref), ("dx", dx, dx_ref),
                               ("dbx", dbx, dbx_ref), ("grads dw", gw, dw_ref),
                               ("grads db", gb, db_ref), ("grads dx", gx, dx_ref),
                               ("grads dbx", gbx, dbx_ref)):
            np.testing.assert_array_equal(
                host(got), ref, err_msg=f"{name} rows={rows} warps={warps} unroll={unroll} "
                                        f"(seed {rng.seed})")
    # the one pass without the mask or either bias gradient, and on the unaligned mask
    for bw, bx, mask in itertools.product((False, True), (False, True), (None, "odd")):
        gw, gb, gx, gbx = TC.grads(dev(dy), h, dev(w), odd[:aux.shape[0]] if mask else None,
                                   odd.shape[0] if mask else 0, bgrad_w=bw, bgrad_x=bx,
                                   rows=48)
        want_dx = dx_ref if mask else (dy32 @ w32).astype(f16)
        np.testing.assert_array_equal(host(gw), dw_ref)
        np.testing.assert_array_equal(host(gx), want_dx)
        assert (gb is None) != bw and (gbx is None) != bx
        if bw:
            np.testing.assert_array_equal(host(gb), db_ref)
        if bx:
            np.testing.assert_array_equal(host(gbx), want_dx.astype(f32).sum(0).astype(f16))
    # without the mask and the bias gradients
    dw, db = TC.wgrad(dev(dy), h, bgrad=False, rows=64)
    dx, dbx = TC.dgrad(dev(dy), dev(w), None, 0, bgrad=False, rows=64)
    assert db is None and dbx is None
    np.testing.assert_array_equal(host(dw), dw_ref)
    np.testing.assert_array_equal(host(dx), (dy32 @ w32).astype(f16))
    for rows in (24, 528):
        with pytest.raises(ValueError, match="multiple of 16 from 16 to 512"):
            TC.wgrad(dev(dy), h, bgrad=True, rows=rows)
    with pytest.raises(ValueError, match="warps must be 4 or 8 and unroll 1, 2 or 4"):
        TC.dgrad(dev(dy), dev(w), None, 0, bgrad=False, warps=2)
    with pytest.raises(ValueError, match="more than the grid's 65535"):
        TC._chunks(16 * 65536, 16)


@pytest.mark.parametrize("f16", HALVES, ids=lambda d: np.dtype(d).name)
def test_skinny_tc_kernels_run_where_supported(nb, rng, f16):
    """The backend takes the tensor-core kernels for the 16-bit output layer of the large
    model (forward, both gradients; they agree with NumPy on random data), and the SIMT
    kernels or cuBLASLt where they do not apply: float32, 17 outputs, a width that is not
    a multiple of 64, a batch under ``MIN_ELEMENTS``, FUSEFLOW_SKINNY_TC off."""
    cb = CudaBackend(tf32=False)
    f32 = np.float32
    tol = {f16: 3e-3 if f16 == np.float16 else 2e-2}
    h, aux = cb.activation(dev(normal(rng, (8192, 512), f16)), "relu")
    w = normal(rng, (10, 512), f16, 512 ** -0.5)
    b, dy = normal(rng, (10,), f16), normal(rng, (8192, 10), f16)
    n0 = cb.stats()["skinny_tc"]
    y, _ = cb.linear(h, dev(w), dev(b), "BIAS")
    dw, db = cb.linear_wgrad(dev(dy), h, "BGRADB")
    dx, dbx = cb.linear_dgrad(dev(dy), dev(w), "DRELU_BGRAD", aux)
    assert cb.stats()["skinny_tc"] == n0 + 3
    hh = host(h).astype(f32)
    y_ref, _ = nb.linear(hh, w.astype(f32), b.astype(f32), "BIAS")
    dw_ref, db_ref = nb.linear_wgrad(dy.astype(f32), hh, "BGRADB")
    dx_ref, dbx_ref = nb.linear_dgrad(dy.astype(f32), w.astype(f32), "DRELU_BGRAD", host(aux))
    for name, got, ref in (("y", y, y_ref), ("dw", dw, dw_ref), ("db", db, db_ref),
                           ("dx", dx, dx_ref), ("dbx", dbx, dbx_ref)):
        check_close(name, got, ref, f16, rng.seed, tol=tol)
    for dt, batch, fin, fout in ((f32, 8192, 512, 10), (f16, 8192, 512, 17),
                                 (f16, 8192, 520, 10), (f16, 256, 512, 10)):
        hx = dev(normal(rng, (batch, fin), dt))
        dyx = dev(normal(rng, (batch, fout), dt))
        cb.linear_wgrad(dyx, hx, "BGRADB")
        cb.linear_dgrad(dyx, dev(normal(rng, (fout, fin), dt)), "DEFAULT")
        assert cb.stats()["skinny_tc"] == n0 + 3, (dt, batch, fin, fout)
    cb.skinny_tc = False
    cb.linear_wgrad(dev(dy), h, "BGRADB")
    assert cb.stats()["skinny_tc"] == n0 + 3


@pytest.mark.parametrize("f16", HALVES, ids=lambda d: np.dtype(d).name)
def test_linear_grads_takes_one_pass_where_both_would_be_tensor_core_kernels(nb, rng, f16):
    """``linear_grads`` on the 16-bit output layer of a long batch is one ``tc_grads``
    launch whose dw, dx and head bias gradient equal ``linear_wgrad`` + ``linear_dgrad``'s
    bit for bit (dx's column sums to float16 rounding: added in another order), and both
    agree with NumPy in float32. Where either kernel would not be the tensor-core one
    (float32, 17 outputs, a GELU mask, FUSEFLOW_FUSED_SKINNY_GRADS off) it returns None
    and counts nothing; a side stream that would take the weight gradient (overlap) also
    keeps the two calls."""
    cb = CudaBackend(tf32=False)
    cb.fused_skinny_grads = True  # the default, unless FUSEFLOW_FUSED_SKINNY_GRADS=0
    f32 = np.float32
    wide = 1 if f16 == np.float16 else 8  # bfloat16's rounding against float16's
    h, aux = cb.activation(dev(normal(rng, (8192, 1024), f16)), "relu")
    w = dev(normal(rng, (10, 1024), f16, 1024 ** -0.5))
    dy = dev(normal(rng, (8192, 10), f16, 0.1))
    calls, fused = cb.calls.copy(), cb.stats()["fused_skinny_grads"]
    dw, db, dx, dbx = cb.linear_grads(dy, h, w, "BGRADB", "DRELU_BGRAD", aux)
    assert cb.stats()["fused_skinny_grads"] == fused + 1
    key = "linear_grads/BGRADB+DRELU_BGRAD"
    assert cb.calls[key] == calls[key] + 1
    assert cb.calls["linear_wgrad/BGRADB"] == calls["linear_wgrad/BGRADB"]
    sw, sb = cb.linear_wgrad(dy, h, "BGRADB")
    sx, sbx = cb.linear_dgrad(dy, w, "DRELU_BGRAD", aux)
    for name, got, ref in (("dw", dw, sw), ("db", db, sb), ("dx", dx, sx)):
        np.testing.assert_array_equal(host(got), host(ref), err_msg=f"{name} (seed {rng.seed})")
    check_close("dbx", dbx, host(sbx), f16, rng.seed, tol={f16: 2e-3 * wide},
                scale=host(sx).astype(f32))
    hh, w32, dy32 = host(h).astype(f32), host(w).astype(f32), host(dy).astype(f32)
    dw_ref, db_ref = nb.linear_wgrad(dy32, hh, "BGRADB")
    dx_ref, dbx_ref = nb.linear_dgrad(dy32, w32, "DRELU_BGRAD", host(aux))
    for name, got, ref in (("dw", dw, dw_ref), ("db", db, db_ref), ("dx", dx, dx_ref),
                           ("dbx", dbx, dbx_ref)):
        check_close(name, got, ref, f16, rng.seed, tol={f16: 3e-3 * wide})
    # not the tensor-core kernels, or overlapped: None, nothing counted
    h32 = h.astype(f32)
    _, aux17 = cb.activation(dev(normal(rng, (8192, 1024), f16)), "relu")
    gelu_x = dev(normal(rng, (8192, 1024), f16))
    _, gaux = cb.activation(gelu_x, "gelu")
    assert cb.linear_grads(dy.astype(f32), h32, w.astype(f32), "BGRADB", "DRELU_BGRAD",
                           aux) is None
    assert cb.linear_grads(dev(normal(rng, (8192, 17), f16)), h,
                           dev(normal(rng, (17, 1024), f16)), "BGRADB", "DRELU_BGRAD",
                           aux17) is None
    assert cb.linear_grads(dy, gelu_x, w, "BGRADB", "DGELU_BGRAD", gaux) is None
    cb.fused_skinny_grads = False
    assert cb.linear_grads(dy, h, w, "BGRADB", "DRELU_BGRAD", aux) is None
    cb.fused_skinny_grads = True
    scope_before = cb.overlap_wgrad
    cb.overlap_wgrad = True
    with cb.overlapping_wgrad():
        assert cb.linear_grads(dy, h, w, "BGRADB", "DRELU_BGRAD", aux, overlap=True) is None
    cb.overlap_wgrad = scope_before
    assert cb.stats()["fused_skinny_grads"] == fused + 1


def test_dense_layers_take_the_one_pass_backward_and_match_the_two_calls(rng):
    """``dense_backward`` and ``dense_softmax_xent`` (an output layer of 10 over a ReLU layer
    of 512, float16, batch 8192) use ``linear_grads``' one pass and give the two separate
    calls' gradients: dw, dx and the head's bias gradient bit for bit, the lower layer's
    bias gradient to float16 rounding."""
    from fuseflow.ops.dense import dense_backward, dense_softmax_xent

    cb = fb.get("cuda")
    f16 = np.float16
    h, aux = cb.activation(dev(normal(rng, (8192, 512), f16)), "relu")
    params = {"w": dev(normal(rng, (10, 512), f16, 512 ** -0.5)),
              "b": dev(normal(rng, (10,), f16))}
    labels = dev(rng.integers(0, 10, 8192).astype(np.int32))
    dy = dev(normal(rng, (8192, 10), f16, 0.1))
    runs, previous = {}, cb.fused_skinny_grads
    for fused in (True, False):
        cb.fused_skinny_grads = fused
        try:
            n0 = cb.stats()["fused_skinny_grads"]
            grads, dx, idb = dense_backward(params, {"x": h}, dy, input_activation="relu",
                                            input_aux=aux, input_has_bias=True)
            loss, _, xgrads, xdx, xidb = dense_softmax_xent(
                params, {"x": h}, labels, input_activation="relu", input_aux=aux,
                input_has_bias=True, grad_scale=dev(np.float32(1024.0)), grad_dtype=f16)
            assert cb.stats()["fused_skinny_grads"] == n0 + (2 if fused else 0)
        finally:
            cb.fused_skinny_grads = previous
        runs[fused] = [host(a) for a in (grads["w"], grads["b"], dx, idb, loss,
                                         xgrads["w"], xgrads["b"], xdx, xidb)]
    names = ["dw", "db", "dx", "input db", "loss", "xent dw", "xent db", "xent dx",
             "xent input db"]
    for name, got, ref in zip(names, runs[True], runs[False]):
        if name.endswith("input db"):
            np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32),
                                       rtol=2e-3, atol=2e-3 * float(np.abs(ref).max()),
                                       err_msg=f"{name} (seed {rng.seed})")
        else:
            np.testing.assert_array_equal(got, ref, err_msg=f"{name} (seed {rng.seed})")


# ---- fused chains: forward aux straight into the backward ------------------------------------
@pytest.mark.parametrize("features", [8, 13, 37, 1000])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_chain_forward_aux_into_dgrad_without_copies(nb, rng, dtype, activation, features):
    cb = CudaBackend(tf32=False)
    batch, fin, fout2 = 24, 10, 6
    x = normal(rng, (batch, fin), dtype)
    w1 = normal(rng, (features, fin), dtype, 1 / np.sqrt(fin))
    b1 = normal(rng, (features,), dtype)
    w2 = normal(rng, (fout2, features), dtype, 1 / np.sqrt(features))
    dz = normal(rng, (batch, fout2), dtype)
    fwd, bwd = f"{activation.upper()}_AUX_BIAS", f"D{activation.upper()}_BGRAD"

    h_ref, aux_ref = nb.linear(x, w1, b1, fwd)
    dh_ref, db_ref = nb.linear_dgrad(dz, w2, bwd, aux_ref)
    h, aux = cb.linear(dev(x), dev(w1), dev(b1), fwd)
    dh, db = cb.linear_dgrad(dev(dz), dev(w2), bwd, aux)
    gelu_tol = GELU_EPILOG_TOL if activation == "gelu" else None
    check_close("h", h, h_ref, dtype, rng.seed, gelu_tol)
    if activation == "gelu":
        # nvmath allocates gelu_aux with round_up(F, 8) rows; the backend returns the
        # (F, batch) view and hands the padded buffer back to cuBLASLt without a copy.
        m8 = -(-features // 8) * 8
        assert aux.shape == (features, batch)
        assert aux.strides == (aux.itemsize, m8 * aux.itemsize)
    if activation == "relu":
        bits_ok = np.abs(x.astype(np.float64) @ w1.T.astype(np.float64) + b1) \
            > SIGN_MARGIN[dtype]
        # compare only where the sign is unambiguous: the masks feed the gradient
        assert ((unpack_relu_aux(host(aux), features) == unpack_relu_aux(aux_ref, features))
                | ~bits_ok).all()
        aux_ref = host(aux)  # same mask on both sides for the gradient comparison
        dh_ref, db_ref = nb.linear_dgrad(dz, w2, bwd, aux_ref)
    else:
        aux_ref = host(aux)
        dh_ref, db_ref = nb.linear_dgrad(dz, w2, bwd, aux_ref)
    check_close("dh", dh, dh_ref, dtype, rng.seed, gelu_tol)
    check_close("dbias", db, db_ref, dtype, rng.seed, gelu_tol, scale=dh_ref)
    s = cb.stats()
    assert s["copies"] == {}, s["copies"]
    assert s["fallbacks"] == {}, s["fallbacks"]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_no_fallbacks_or_copies_on_ordinary_shapes(rng, dtype):
    cb = CudaBackend(tf32=False)
    cb.own_gemm_max_macs = 0  # cuBLASLt plans for every epilog ...
    cb.fp32_wgmma = "off"  # ... and takes float32's products (the 3xTF32 kernel would)
    batch, fin, fout = 64, 48, 96
    x, w = dev(normal(rng, (batch, fin), dtype)), dev(normal(rng, (fout, fin), dtype))
    b = dev(normal(rng, (fout,), dtype))
    for e, spec in EPILOGS.items():
        cb.linear(x, w, b if spec.bias else None, e)
    dy = dev(normal(rng, (batch, fout), dtype))
    _, raux = cb.linear(x, w, b, "RELU_AUX_BIAS")
    _, gaux = cb.linear(x, w, b, "GELU_AUX_BIAS")
    w2 = dev(normal(rng, (40, fout), dtype))   # 40 > 32: cuBLASLt, not the skinny kernels
    dz = dev(normal(rng, (batch, 40), dtype))
    for e in DGRAD_EPILOGS:
        cb.linear_dgrad(dz, w2, e, {"relu": raux, "gelu": gaux, None: None}[
            DGRAD_EPILOGS[e].activation])
    for e in WGRAD_EPILOGS:
        cb.linear_wgrad(dy, x, e)
    s = cb.stats()
    assert s["fallbacks"] == {} and s["copies"] == {}, (s["fallbacks"], s["copies"])
    assert s["plans"] == len(EPILOGS) + len(DGRAD_EPILOGS) + len(WGRAD_EPILOGS)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_cublaslt_gelu_accuracy(record_property, dtype):
    """How far cuBLASLt's GELU / DGELU epilogs are from the exact tanh-GELU (recorded in the
    junit properties; the bounds are loose, the numbers are what docs/gpu.md reports)."""
    from fuseflow.backend.numpy_backend import gelu, gelu_grad

    cb = CudaBackend(tf32=False)
    grid = np.linspace(-8, 8, 64 * 96).reshape(64, 96).astype(dtype)
    eye = np.eye(96, dtype=dtype)                     # x @ I.T is exact: y = gelu(x)
    y, aux = cb.linear(dev(grid), dev(eye), None, "GELU_AUX")
    exact = gelu(grid.astype(np.float64))
    got = host(y).astype(np.float64)
    big = np.abs(exact) > 1e-3
    fwd_abs = float(np.abs(got - exact).max())
    fwd_rel = float((np.abs(got - exact)[big] / np.abs(exact[big])).max())
    np.testing.assert_array_equal(host(aux), grid.T)  # the aux is the exact pre-activation
    dx, _ = cb.linear_dgrad(dev(np.ones((64, 96), dtype)), dev(eye), "DGELU", aux)
    dexact = gelu_grad(grid.astype(np.float64))
    bwd_abs = float(np.abs(host(dx).astype(np.float64) - dexact).max())
    for k, v in {"gelu_max_abs_err": fwd_abs, "gelu_max_rel_err": fwd_rel,
                 "dgelu_max_abs_err": bwd_abs,
                 "gelu_norm_rel_err": float(rel_err(got, exact))}.items():
        record_property(k, v)
    print(f"cuBLASLt GELU {np.dtype(dtype).name}: max abs {fwd_abs:.3g}, max rel (|y|>1e-3) "
          f"{fwd_rel:.3g}; DGELU max abs {bwd_abs:.3g}")
    bound = 1e-4 if dtype == np.float32 else 1e-7
    assert fwd_abs < bound and bwd_abs < bound
    assert cb.stats()["fallbacks"] == {}


@pytest.mark.parametrize("shape", [(1, 1), (1, 37), (7, 1), (65, 33), (200, 1000), (129, 5)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_bias_grad_matches_numpy(cb, nb, rng, dtype, shape):
    a = normal(rng, shape, dtype)
    got = cb.bias_grad(dev(a))
    assert got.shape == (shape[1],) and got.dtype == dtype
    check_close("bias_grad", got, nb.bias_grad(a), dtype, rng.seed)
    strided = dev(np.repeat(a, 2, axis=1))[:, ::2]           # non-contiguous input
    check_close("bias_grad (strided)", cb.bias_grad(strided), nb.bias_grad(a), dtype, rng.seed)


# ---- standalone activation kernels -----------------------------------------------------------
@pytest.mark.parametrize("features", [1, 7, 8, 9, 37, 1000])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_activation_kernels_match_numpy(cb, nb, rng, dtype, activation, features):
    batch = 21
    x = normal(rng, (batch, features), dtype)
    x[:, ::3] = 0
    dy = normal(rng, (batch, features), dtype)
    y_ref, aux_ref = nb.activation(x, activation)
    y, aux = cb.activation(dev(x), activation)
    check_close("y", y, y_ref, dtype, rng.seed)
    if activation == "relu":
        np.testing.assert_array_equal(host(y), y_ref)
        np.testing.assert_array_equal(host(aux), aux_ref)
    else:
        np.testing.assert_array_equal(host(aux), aux_ref)
    y2, aux2 = cb.activation(dev(x), activation, want_aux=False)
    assert aux2 is None
    check_close("y (no aux)", y2, y_ref, dtype, rng.seed)
    dx_ref = nb.activation_grad(dy, activation, aux_ref)
    dx = cb.activation_grad(dev(dy), activation, aux)
    check_close("dx", dx, dx_ref, dtype, rng.seed)
    if activation == "relu":
        np.testing.assert_array_equal(host(dx), dx_ref)
        # an aux whose columns are further apart than its rows (a strided view) reads right,
        # and is copied into cuBLASLt's exact layout before a fused matmul
        rows = relu_aux_rows(features)
        big = cupy.full((rows + 16, batch), 0xFF, dtype=cupy.uint8, order="F")
        big[:rows] = aux
        view = big[:rows]
        assert view.strides == (1, rows + 16)
        np.testing.assert_array_equal(host(cb.activation_grad(dev(dy), "relu", view)), dx_ref)


def test_relu_grad_never_reads_padding_bits(cb, rng):
    """Padding bits (rows >= F) are garbage on the GPU: set them all and check nothing leaks."""
    batch, features = 9, 13                      # 2 data bytes, 14 padding bytes; 3 padding bits
    x = normal(rng, (batch, features), np.float32)
    _, aux = cb.activation(dev(x), "relu")
    poisoned = aux.copy(order="F")
    poisoned[2:] = 0xFF
    poisoned[1] |= np.uint8(0b11100000)          # bits of features 13, 14, 15
    dy = dev(normal(rng, (batch, features), np.float32))
    np.testing.assert_array_equal(host(cb.activation_grad(dy, "relu", poisoned)),
                                  host(cb.activation_grad(dy, "relu", aux)))
    w = dev(normal(rng, (4, features), np.float32))
    dz = dev(normal(rng, (batch, 4), np.float32))
    a = cb.linear_dgrad(dz, w, "DRELU_BGRAD", aux)
    p = cb.linear_dgrad(dz, w, "DRELU_BGRAD", poisoned)
    np.testing.assert_array_equal(host(a[0]), host(p[0]))
    np.testing.assert_array_equal(host(a[1]), host(p[1]))


# ---- layouts, copies, plan cache -------------------------------------------------------------
def test_odd_layouts_are_copied_and_still_right(nb, rng):
    cb = CudaBackend(tf32=False)
    dtype = np.float32
    x = normal(rng, (32, 40), dtype)
    w = normal(rng, (24, 20), dtype)
    flat = dev(normal(rng, (25,), dtype))
    b_odd = flat[1:]                             # 4-byte aligned view: copied before cuBLASLt
    b = host(b_odd)
    xs = dev(x)[:, ::2]                          # non-contiguous input
    y_ref, _ = nb.linear(np.ascontiguousarray(x[:, ::2]), w, b, "RELU_AUX_BIAS")
    y, _ = cb.linear(xs, dev(w), b_odd, "RELU_AUX_BIAS")
    check_close("y", y, y_ref, dtype, rng.seed)
    yf, _ = cb.linear(cupy.asfortranarray(dev(x[:, ::2])), cupy.asfortranarray(dev(w)),
                      b_odd, "BIAS")
    check_close("y (F-ordered operands)", yf, nb.linear(x[:, ::2].copy(), w, b, "BIAS")[0],
                dtype, rng.seed)
    c = cb.stats()["copies"]
    assert c.get("x", 0) >= 2 and c.get("bias", 0) >= 1 and c.get("w", 0) >= 1, c


def test_plan_cache_hits_and_operand_reset(nb, rng):
    cb = CudaBackend(tf32=False)
    cb.skinny_max = 0  # every matmul through cuBLASLt plans
    cb.own_gemm_max_macs = 0
    dtype = np.float32
    shape_x, shape_w = (32, 24), (40, 24)
    results = []
    for i in range(3):
        x, w, b = (normal(rng, shape_x, dtype), normal(rng, shape_w, dtype),
                   normal(rng, (40,), dtype))
        y, aux = cb.linear(dev(x), dev(w), dev(b), "RELU_AUX_BIAS")
        results.append((y, aux, nb.linear(x, w, b, "RELU_AUX_BIAS")))
        s = cb.stats()
        assert s["plans"] == 1, s
        assert s["cache_hits"] == i and s["executions"] == i + 1, s
    for y, _, (y_ref, _) in results:   # every call saw its own operands
        check_close("y", y, y_ref, dtype, rng.seed)
    # the aux (an epilog input) is swapped too
    w2 = normal(rng, (8, 40), dtype)
    dz = normal(rng, (32, 8), dtype)
    for _, aux, _ in results:
        dh, db = cb.linear_dgrad(dev(dz), dev(w2), "DRELU_BGRAD", aux)
        dh_ref, db_ref = nb.linear_dgrad(dz, w2, "DRELU_BGRAD", host(aux))
        check_close("dh", dh, dh_ref, dtype, rng.seed)
        check_close("db", db, db_ref, dtype, rng.seed)
    s = cb.stats()
    assert s["plans"] == 2 and s["cache_hits"] == 4, s
    assert s["planning_s"] > 0
    assert s["calls"]["linear/RELU_AUX_BIAS"] == 3
    # another shape, and TF32, each make a new plan
    cb.linear(dev(normal(rng, (33, 24), dtype)), dev(normal(rng, shape_w, dtype)),
              dev(normal(rng, (40,), dtype)), "RELU_AUX_BIAS")
    assert cb.stats()["plans"] == 3
    cb.tf32 = True
    x, w, b = normal(rng, shape_x, dtype), normal(rng, shape_w, dtype), normal(rng, (40,), dtype)
    y, _ = cb.linear(dev(x), dev(w), dev(b), "RELU_AUX_BIAS")
    assert cb.stats()["plans"] == 4
    assert rel_err(host(y), nb.linear(x, w, b, "RELU_AUX_BIAS")[0]) < 1e-2  # TF32: ~1e-3
    cb.reset_stats()
    assert cb.stats()["plans"] == 0 and cb.stats()["cache_size"] == 4


def test_cache_is_bounded(rng):
    cb = CudaBackend(tf32=False, max_plans=3)
    cb.skinny_max = 0
    cb.own_gemm_max_macs = 0
    for n in range(1, 7):
        cb.linear(dev(normal(rng, (n, 8), np.float32)), dev(normal(rng, (4, 8), np.float32)))
    s = cb.stats()
    assert s["cache_size"] == 3 and s["evictions"] == 3 and s["plans"] == 6


def test_tf32_bias_relu_epilogs_take_the_own_pass(rng):
    """With TF32, the medium model's bias/ReLU forward and DRELU_BGRAD input gradient run
    as a plain matmul plus fuseflow's epilog pass, as in full float32 (cuBLASLt's sm90 TF32
    kernels run those epilogs as a slow separate kernel), and match NumPy in float64 within
    TF32's rounding; the mask is the GPU's own pre-activations' sign."""
    cb, nb = CudaBackend(tf32=True), NumpyBackend()
    x, w1 = normal(rng, (256, 784), np.float32), normal(rng, (1024, 784), np.float32, 0.05)
    b1, w2 = normal(rng, (1024,), np.float32), normal(rng, (512, 1024), np.float32, 0.03)
    dz = normal(rng, (256, 512), np.float32)
    y, aux = cb.linear(dev(x), dev(w1), dev(b1), "RELU_AUX_BIAS")
    z_ref = x.astype(np.float64) @ w1.T.astype(np.float64) + b1
    assert rel_err(host(y), np.maximum(z_ref, 0.0)) < 1e-2  # TF32: about 1e-3
    # The bit is the pre-activation's z >= 0 (docs/gpu.md), so it is set wherever y > 0
    # and, where y == 0, only for a z of exactly zero: with TF32 sums that happens (call
    # 181's seed 1344964674), and only where the float64 pre-activation is within TF32's
    # error of zero.
    bits, positive = unpack_relu_aux(host(aux), 1024), host(y) > 0
    assert bits[positive].all()
    ties = bits & ~positive
    assert (np.abs(z_ref[ties]) < 1e-2 * np.sqrt(np.mean(z_ref ** 2))).all()
    assert ties.sum() <= 16
    dh, db = cb.linear_dgrad(dev(dz), dev(w2), "DRELU_BGRAD", aux)
    dh_ref, db_ref = nb.linear_dgrad(dz.astype(np.float64), w2.astype(np.float64),
                                     "DRELU_BGRAD", host(aux))
    assert rel_err(host(dh), dh_ref) < 1e-2 and rel_err(host(db), db_ref) < 1e-2
    assert cb.stats()["own_epilog"] == 2


@pytest.mark.parametrize("k_splits", ["auto", 0, 4])
@pytest.mark.parametrize("tf32", [False, True], ids=["fp32", "tf32"])
def test_gelu_epilogs_take_the_own_pass(rng, tf32, k_splits):
    """In float32 from ``own_epilog_min`` on, DGELU_BGRAD runs as a plain matmul (or its
    K-slice partials) plus fuseflow's GELU-gradient pass, against NumPy in float64 and
    cuBLASLt's own DGELU_BGRAD. The GELU_AUX_BIAS forward takes the own pass in full
    float32 and stays cuBLASLt's with TF32 (faster there, calls 174-175); both forwards
    (``own_epilog`` "off" and "all") give y and gelu_aux."""
    from fuseflow.backend.numpy_backend import gelu

    cb, off, own = (CudaBackend(tf32=tf32) for _ in range(3))
    for be in (cb, off, own):
        be.own_gemm_max_macs, be.k_splits = 0, k_splits
    off.own_epilog, own.own_epilog = "off", "all"
    x, w1 = normal(rng, (256, 784), np.float32), normal(rng, (1024, 784), np.float32, 0.05)
    b1, w2 = normal(rng, (1024,), np.float32), normal(rng, (512, 1024), np.float32, 0.03)
    dz = normal(rng, (256, 512), np.float32)
    tol = 1e-2 if tf32 else 1e-5    # TF32: about 1e-3
    gelu_atol = GELU_EPILOG_TOL[np.float32]    # cuBLASLt's approximation of the tanh-GELU
    pre = x.astype(np.float64) @ w1.T.astype(np.float64) + b1
    y, aux = off.linear(dev(x), dev(w1), dev(b1), "GELU_AUX_BIAS")
    assert off.stats()["own_epilog"] == 0 and off.stats()["k_split"] == 0
    y_own, aux_own = own.linear(dev(x), dev(w1), dev(b1), "GELU_AUX_BIAS")
    assert own.stats()["own_epilog"] == 1
    assert own.stats()["k_split"] == (0 if k_splits == 0 else 1)
    cb.linear(dev(x), dev(w1), dev(b1), "GELU_AUX_BIAS")   # the default's choice
    forward_own = 0 if tf32 else 1
    assert cb.stats()["own_epilog"] == forward_own
    assert cb.stats()["k_split"] == (0 if k_splits == 0 else forward_own)
    cb.reset_stats()
    for got_y, got_aux, atol in ((y, aux, gelu_atol), (y_own, aux_own, 1e-6)):
        assert got_aux.shape == (1024, 256) and got_aux.dtype == np.float32
        assert rel_err(host(got_aux), pre.T) < tol and rel_err(host(got_y), gelu(pre)) < tol
        # y is the GELU of the GPU's own pre-activation
        np.testing.assert_allclose(host(got_y), gelu(host(got_aux).T.astype(np.float64)),
                                   rtol=1e-5, atol=atol)
    dh, db = cb.linear_dgrad(dev(dz), dev(w2), "DGELU_BGRAD", aux)
    dh_ref, db_ref = NumpyBackend().linear_dgrad(dz.astype(np.float64), w2.astype(np.float64),
                                                 "DGELU_BGRAD", host(aux).astype(np.float64))
    assert rel_err(host(dh), dh_ref) < tol and rel_err(host(db), db_ref) < tol
    assert cb.stats()["own_epilog"] == 1
    assert cb.stats()["k_split"] == (0 if k_splits == 0 else 1)
    for be, a in ((off, aux), (cb, aux_own)):   # cuBLASLt's DGELU; the own forward's aux
        dh2, db2 = be.linear_dgrad(dev(dz), dev(w2), "DGELU_BGRAD", a)
        tol2 = 1e-2 if tf32 else 1e-4   # cuBLASLt's DGELU approximation (docs/gpu.md)
        assert rel_err(host(dh2), host(dh)) < tol2 and rel_err(host(db2), host(db)) < tol2
    assert off.stats()["own_epilog"] == 0


@pytest.mark.parametrize("dtype", HALVES)
def test_half_gelu_input_gradients_take_the_own_pass(rng, dtype, monkeypatch):
    """In 16 bits from ``HALF_DGELU_MIN`` batch x features on, DGELU_BGRAD runs as a plain
    matmul plus fuseflow's GELU-gradient pass (cuBLASLt ran the large model's K = 10 one
    as a SIMT matmul and a 307 us epilog kernel, call 182), also at K = 10, while the
    GELU_AUX_BIAS forward stays cuBLASLt's fused one. The results match NumPy in float64
    and cuBLASLt's DGELU_BGRAD within the 16-bit bounds (the pass rounds the product
    before ``gelu'``). Under the threshold cuBLASLt's DGELU_BGRAD stays."""
    batch, features = 2048, 1024
    assert batch * features >= _cuda.HALF_DGELU_MIN
    cb, off = CudaBackend(tf32=False), CudaBackend(tf32=False)
    off.own_epilog = "off"
    x, w1 = normal(rng, (batch, 96), dtype), normal(rng, (features, 96), dtype, 0.1)
    b1 = normal(rng, (features,), dtype)
    y, aux = cb.linear(dev(x), dev(w1), dev(b1), "GELU_AUX_BIAS")
    assert cb.stats()["own_epilog"] == 0    # the forward: cuBLASLt's fused epilog
    for k in (10, 64):                      # the output layer's K, and a hidden layer's
        w2, dz = normal(rng, (k, features), dtype, 0.3), normal(rng, (batch, k), dtype)
        cb.reset_stats()
        dh, db = cb.linear_dgrad(dev(dz), dev(w2), "DGELU_BGRAD", aux)
        assert cb.stats()["own_epilog"] == 1, k
        dh_ref, db_ref = NumpyBackend().linear_dgrad(
            dz.astype(np.float64), w2.astype(np.float64), "DGELU_BGRAD",
            host(aux).astype(np.float64))
        assert rel_err(host(dh), dh_ref) < TOL[dtype] and rel_err(host(db), db_ref) < TOL[dtype]
        dh2, db2 = off.linear_dgrad(dev(dz), dev(w2), "DGELU_BGRAD", aux)
        assert off.stats()["own_epilog"] == 0
        assert rel_err(host(dh2), host(dh)) < GELU_EPILOG_TOL[dtype]
        assert rel_err(host(db2), host(db)) < GELU_EPILOG_TOL[dtype]
    monkeypatch.setattr(_cuda, "HALF_DGELU_MIN", batch * features + 1)
    small = CudaBackend(tf32=False)         # under the threshold: cuBLASLt's DGELU_BGRAD
    dh3, db3 = small.linear_dgrad(dev(dz), dev(w2), "DGELU_BGRAD", aux)
    assert small.stats()["own_epilog"] == 0
    np.testing.assert_array_equal(host(dh3), host(dh2))   # cuBLASLt's, as "off" gave it
    np.testing.assert_array_equal(host(db3), host(db2))


def test_tf32_env_switch(monkeypatch):
    monkeypatch.setenv("FUSEFLOW_TF32", "1")
    assert CudaBackend().tf32 is True
    monkeypatch.setenv("FUSEFLOW_TF32", "0")
    assert CudaBackend().tf32 is False
    monkeypatch.setenv("FUSEFLOW_TF32", "true")  # not a spelling it knows: warns, stays off
    with pytest.warns(UserWarning, match="FUSEFLOW_TF32='true' is not one of"):
        assert CudaBackend().tf32 is False


# ---- placement and DLPack --------------------------------------------------------------------
def test_asarray_numpy_cupy_and_to_numpy(cb, rng):
    x = normal(rng, (5, 3), np.float32)
    a = cb.asarray(x)
    assert isinstance(a, cupy.ndarray)
    np.testing.assert_array_equal(cb.to_numpy(a), x)
    assert cb.asarray(a) is a
    assert cb.asarray(a, dtype=np.float16).dtype == np.float16
    assert fb.of(a).name == "cuda" and fb.of(x).name == "numpy"
    assert isinstance(fb.device_put({"w": x}, "cuda")["w"], cupy.ndarray)


def test_dlpack_torch_both_ways_without_copies(cb):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    t = torch.randn(64, 32, device="cuda")
    a = cb.asarray(t)
    assert isinstance(a, cupy.ndarray) and a.data.ptr == t.data_ptr()
    assert fb.asarray(t).data.ptr == t.data_ptr()
    back = torch.from_dlpack(a)
    assert back.data_ptr() == a.data.ptr
    w = torch.randn(16, 32, device="cuda")
    y, _ = cb.linear(a, cb.asarray(w), None, "DEFAULT")
    ref = (t @ w.T).cpu().numpy()
    assert rel_err(host(y), ref) < 1e-5
    # a torch tensor on the host is copied to the GPU
    c = torch.randn(3, 4)
    np.testing.assert_array_equal(host(cb.asarray(c)), c.numpy())
    np.testing.assert_array_equal(cb.to_numpy(t), t.cpu().numpy())


def test_dlpack_jax_both_ways_without_copies(cb):
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    gpus = [d for d in jax.devices() if d.platform in ("gpu", "cuda")]
    if not gpus:
        pytest.skip("JAX without a GPU backend")
    x = jax.device_put(jnp.arange(64 * 32, dtype=jnp.float32).reshape(64, 32), gpus[0])
    x.block_until_ready()
    a = cb.asarray(x)
    assert isinstance(a, cupy.ndarray) and a.data.ptr == x.unsafe_buffer_pointer()
    np.testing.assert_array_equal(host(a), np.asarray(x))
    c = cupy.arange(48, dtype=cupy.float32).reshape(6, 8)
    j = jnp.from_dlpack(c)
    assert j.unsafe_buffer_pointer() == c.data.ptr
    np.testing.assert_array_equal(np.asarray(j), host(c))


# ---- errors ----------------------------------------------------------------------------------
def test_error_wrong_aux_shape(cb, rng):
    dy = dev(normal(rng, (8, 4), np.float32))
    w = dev(normal(rng, (4, 16), np.float32))
    _, aux_other_batch = cb.activation(dev(normal(rng, (9, 16), np.float32)), "relu")
    with pytest.raises(BackendError, match="relu_aux has shape"):
        cb.linear_dgrad(dy, w, "DRELU_BGRAD", aux_other_batch)
    with pytest.raises(BackendError, match="gelu_aux has shape"):
        cb.linear_dgrad(dy, w, "DGELU", dev(normal(rng, (15, 8), np.float32)))
    with pytest.raises(BackendError, match="dtype"):
        cb.linear_dgrad(dy, w, "DRELU", cupy.zeros((16, 8), dtype=cupy.int8))
    with pytest.raises(BackendError, match="required"):
        cb.linear_dgrad(dy, w, "DRELU")


def test_error_host_array_mixed_with_gpu(cb, rng):
    x = normal(rng, (8, 4), np.float32)
    w = normal(rng, (3, 4), np.float32)
    with pytest.raises(BackendError, match="NumPy array on the host"):
        cb.linear(x, dev(w))
    with pytest.raises(BackendError, match="host"):
        fb.of(x, dev(w))
    dy = dev(normal(rng, (8, 3), np.float32))
    aux_host = pack_relu_aux(normal(rng, (8, 4), np.float32))
    with pytest.raises(BackendError, match="aux is a NumPy array"):
        cb.linear_dgrad(dy, dev(w), "DRELU", aux_host)
    with pytest.raises(BackendError, match="NumPy array"):
        cb.activation(x, "relu")


def test_error_unsupported_dtype(cb):
    x = cupy.ones((8, 4), dtype=cupy.int32)
    w = cupy.ones((3, 4), dtype=cupy.int32)
    with pytest.raises(BackendError, match="int32 is not supported"):
        cb.linear(x, w)
    with pytest.raises(BackendError, match="int32 is not supported"):
        cb.linear_wgrad(cupy.ones((8, 3), dtype=cupy.int32), x)
    with pytest.raises(BackendError, match="int32 is not supported"):
        cb.activation(x, "relu")
    with pytest.raises(BackendError, match="share one dtype"):
        cb.linear(x.astype(cupy.float32), w.astype(cupy.float16))


def test_error_out_of_memory_is_clear_and_recoverable(cb, rng):
    n = 1 << 18                                  # y would be 2^36 float32 = 256 GiB
    x = cupy.ones((n, 8), dtype=cupy.float32)
    w = cupy.ones((n, 8), dtype=cupy.float32)
    with pytest.raises(GPUOutOfMemoryError, match="smaller batch") as ei:
        cb.linear(x, w)
    assert isinstance(ei.value, BackendError) and isinstance(ei.value, MemoryError)
    assert "262144" in str(ei.value)
    del x, w
    cupy.get_default_memory_pool().free_all_blocks()
    y, _ = cb.linear(dev(normal(rng, (4, 8), np.float32)), dev(normal(rng, (2, 8), np.float32)))
    assert y.shape == (4, 2)


def test_stats_shape(cb):
    s = cb.stats()
    for k in ("backend", "calls", "plans", "planning_s", "cache_hits", "executions",
              "cache_size", "fallbacks", "copies", "tf32"):
        assert k in s
    assert s["backend"] == "cuda"
    assert "cuda" in fb.stats() or fb.get("cuda").name == "cuda"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_own_gelu_grad_beyond_the_largest_finite_square(cb, nb, dtype):
    """The own GELU-gradient kernel where x * x overflows: the limits 1 and 0 (was NaN, 0 *
    inf), as the NumPy reference gives them; ordinary values bit for bit as before."""
    big = {np.float32: [2e19, 1e30, 3e38], np.float64: [2e154, 1e200, 1e308]}[dtype]
    rng = np.random.default_rng(7)
    x = np.array([big + [-b for b in big] + list(rng.uniform(-12, 12, 10))], dtype=dtype)
    dy = (rng.random(x.shape) + 0.5).astype(dtype)
    _, aux = cb.activation(dev(x), "gelu")
    got = host(cb.activation_grad(dev(dy), "gelu", aux))
    with np.errstate(over="ignore"):
        _, naux = nb.activation(x, "gelu")
        want = nb.activation_grad(dy, "gelu", naux)
    np.testing.assert_array_equal(got[0, :6], dy[0, :6] * (x[0, :6] > 0))
    assert np.isfinite(got).all()
    check_close("gelu grad", got, want, dtype, 7)
