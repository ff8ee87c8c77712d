"""The NumPy backend is the reference for every cuBLASLt epilog: test it from definitions."""

import numpy as np
import pytest

from fuseflow.backend import BackendError, get
from fuseflow.backend.epilogs import DGRAD_EPILOGS, EPILOGS, relu_aux_rows
from tests import reference as ref

be = get("numpy")
SHAPES = [(1, 1, 1), (1, 5, 3), (3, 7, 9), (8, 16, 8), (5, 37, 11), (2, 13, 24), (17, 33, 31)]


def rand(rng, *shape):
    return rng.standard_normal(shape)


@pytest.mark.parametrize("batch,features,inp", SHAPES)
@pytest.mark.parametrize("epilog", sorted(EPILOGS))
def test_forward_epilogs_match_definitions(batch, features, inp, epilog):
    rng = np.random.default_rng(batch * 100 + features)
    spec = EPILOGS[epilog]
    x, w, b = rand(rng, batch, inp), rand(rng, features, inp), rand(rng, features)
    x[0] = 0.0  # an all-zero sample: with zero bias entries, exact-zero pre-activations
    b[::3] = 0.0
    y, aux = be.linear(x, w, b if spec.bias else None, epilog)
    pre = x @ w.T + (b if spec.bias else 0)
    np.testing.assert_allclose(y, ref.ACT[spec.activation][0](pre), rtol=1e-13, atol=1e-13)
    if not spec.aux:
        assert aux is None
    elif spec.activation == "relu":
        assert aux.dtype == np.uint8 and aux.shape == (relu_aux_rows(features), batch)
        assert aux.flags.f_contiguous
        np.testing.assert_array_equal(ref.relu_aux_bits(aux, features, batch), pre >= 0)
    else:
        assert aux.shape == (features, batch) and aux.flags.f_contiguous
        np.testing.assert_allclose(aux.T, pre, rtol=1e-13, atol=1e-13)


def test_relu_aux_layout_is_cublaslt():
    """(round_up(ceil(M/8), 16), N) uint8, column-major, bit i of byte j = feature 8j+i."""
    assert [relu_aux_rows(m) for m in (1, 8, 9, 128, 129, 1024)] == [16, 16, 16, 16, 32, 128]
    pre = np.full((2, 10), -1.0)
    pre[0, 9] = 0.0  # feature 9 -> byte 1, bit 1; zero counts as active (>= 0)
    pre[1, 0] = 3.0  # feature 0 -> byte 0, bit 0
    _, aux = be.activation(pre, "relu")
    assert aux[1, 0] == 0b10 and aux[0, 0] == 0 and aux[0, 1] == 1 and aux[1, 1] == 0
    assert aux.strides == (1, 16)


@pytest.mark.parametrize("batch,features,out", SHAPES)
@pytest.mark.parametrize("epilog", sorted(DGRAD_EPILOGS))
def test_dgrad_epilogs_match_definitions_and_ignore_padding(batch, features, out, epilog):
    rng = np.random.default_rng(features * 7 + out)
    spec = DGRAD_EPILOGS[epilog]
    pre = rand(rng, batch, features)
    pre[:, ::4] = 0.0  # exact zeros: the gradient passes (>= 0), unlike PyTorch/JAX
    dy, w = rand(rng, batch, out), rand(rng, out, features)
    aux = None
    if spec.activation == "relu":
        aux = ref.fill_padding_with_garbage(be.activation(pre, "relu")[1], features, rng)
    elif spec.activation == "gelu":
        aux = np.asfortranarray(pre.T)
    dx, db = be.linear_dgrad(dy, w, epilog, aux)
    want = (dy @ w) * ref.ACT[spec.activation][1](pre)
    np.testing.assert_allclose(dx, want, rtol=1e-12, atol=1e-12)
    if spec.bias:
        np.testing.assert_allclose(db, want.sum(0), rtol=1e-12, atol=1e-12)
    else:
        assert db is None


@pytest.mark.parametrize("batch,out,inp", SHAPES)
def test_wgrad_bgradb(batch, out, inp):
    rng = np.random.default_rng(out)
    dy, x = rand(rng, batch, out), rand(rng, batch, inp)
    dw, db = be.linear_wgrad(dy, x, "BGRADB")
    np.testing.assert_allclose(dw, dy.T @ x, rtol=1e-12)
    np.testing.assert_allclose(db, dy.sum(0), rtol=1e-12)
    assert be.linear_wgrad(dy, x)[1] is None


@pytest.mark.parametrize("epilog", ["DGELU", "DGELU_BGRAD"])
def test_float16_dgelu_rounds_once(rng, epilog):
    """DGELU multiplies the float32 product by gelu'(pre) before its one rounding to
    float16, as the forward epilogs round once (rounding dy @ w first put 1 ulp on about a
    quarter of the elements). Reference: the same products in float64, rounded once."""
    pre, dy, w = (rng.standard_normal(s).astype(np.float16)
                  for s in ((64, 33), (64, 17), (17, 33)))
    dx, db = be.linear_dgrad(dy, w, epilog, be.activation(pre, "gelu")[1])
    f64 = np.float64
    want = ((dy.astype(f64) @ w.astype(f64)) * ref.gelu_grad(pre.astype(f64))).astype(np.float16)
    # float32 against float64 arithmetic moves a value across a rounding boundary rarely
    assert (dx != want).mean() < 0.01, f"{(dx != want).mean():.1%} differ (seed {rng.seed})"
    np.testing.assert_allclose(dx.astype(f64), want.astype(f64), rtol=1e-3, atol=1e-3)
    if epilog == "DGELU_BGRAD":  # the column sums of the float16 dx, added in float32
        np.testing.assert_array_equal(db, dx.astype(np.float32).sum(0).astype(np.float16))


def test_float16_accumulates_in_float32():
    rng = np.random.default_rng(0)
    x, w, b = (rand(rng, 64, 300).astype(np.float16), rand(rng, 40, 300).astype(np.float16),
               rand(rng, 40).astype(np.float16))
    y, aux = be.linear(x, w, b, "RELU_AUX_BIAS")
    assert y.dtype == np.float16 and aux.dtype == np.uint8
    want = np.maximum(x.astype(np.float64) @ w.astype(np.float64).T + b, 0)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=1e-2, atol=1e-2)
    # to the bit: the float32 products, bias and ReLU, rounded to float16 once (a float16
    # matmul passes the loose check above)
    x32, w32 = x.astype(np.float32), w.astype(np.float32)
    exact = np.maximum(x32 @ w32.T + b.astype(np.float32), 0).astype(np.float16)
    np.testing.assert_array_equal(y, exact)


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_float16_standalone_activations_compute_in_float32(activation):
    """The standalone activation layers round once from float32, as the fused epilogs do:
    GELU computed in float16 is up to ~1,900 ulps off and passes a 2e-3 tolerance."""
    from tests.reference import ACT

    x = rand(np.random.default_rng(3), 200, 200).astype(np.float16)
    y, _ = be.activation(x, activation)
    exact = ACT[activation][0](x.astype(np.float64)).astype(np.float16)
    ulp = np.spacing(np.abs(exact)).astype(np.float64)  # within one float16 ulp of float64's
    assert (np.abs(y.astype(np.float64) - exact.astype(np.float64)) <= ulp).all()


def test_backend_rejects_bad_operands():
    rng = np.random.default_rng(0)
    x, w = rand(rng, 4, 5), rand(rng, 3, 5)
    with pytest.raises(BackendError, match="share one dtype"):
        be.linear(x.astype(np.float32), w)
    with pytest.raises(BackendError, match="needs bias"):
        be.linear(x, w, None, "RELU_BIAS")
    with pytest.raises(ValueError, match="unknown forward epilog"):
        be.linear(x, w, None, "SWISH")
    _, aux = be.activation(rand(rng, 4, 5), "relu")
    with pytest.raises(BackendError, match="another batch or another layer"):
        be.linear_dgrad(rand(rng, 8, 3), w, "DRELU", aux)
    with pytest.raises(BackendError, match="unknown activation 'tanh'; expected one of "
                       "'relu', 'gelu'"):
        be.activation(rand(rng, 4, 5), "tanh")
    with pytest.raises(BackendError, match="unknown activation 'tanh'"):
        be.activation_grad(rand(rng, 4, 5), "tanh", aux)


def test_linear_grads_checks_both_gradients_operands_and_has_no_fused_form_on_numpy():
    """NumPy has no fused form: ``linear_grads`` returns None at once (the caller then runs
    the two calls, which check the operands), counting nothing. A backend that may fuse
    (here NumPy told so, its ``_linear_grads`` still None) first refuses what
    ``linear_wgrad`` or ``linear_dgrad`` would refuse, and an input whose width is not the
    weight's."""
    rng = np.random.default_rng(0)
    x, w, dy = rand(rng, 4, 5), rand(rng, 3, 5), rand(rng, 4, 3)
    _, aux = be.activation(x, "relu")
    before = be.calls.copy()
    assert not be.fuses_grads
    assert be.linear_grads(dy, x, w, "BGRADB", "DRELU_BGRAD", aux) is None
    assert be.linear_grads(dy, rand(rng, 6, 5), w) is None  # not looked at
    assert be.calls == before

    class MayFuse(type(be)):
        fuses_grads = True

    fusing = MayFuse()
    assert fusing.linear_grads(dy, x, w, "BGRADB", "DRELU_BGRAD", aux) is None
    with pytest.raises(BackendError, match="dy has batch 4 but the saved input has batch 6"):
        fusing.linear_grads(dy, rand(rng, 6, 5), w)
    with pytest.raises(BackendError, match="dy has 3 features but w has 2 outputs"):
        fusing.linear_grads(dy, x, rand(rng, 2, 5))
    with pytest.raises(BackendError, match="x has 7 features but w takes 5 inputs"):
        fusing.linear_grads(dy, rand(rng, 4, 7), w)
    with pytest.raises(BackendError, match="relu_aux is required"):
        fusing.linear_grads(dy, x, w, "DEFAULT", "DRELU")
    with pytest.raises(ValueError, match="unknown weight-gradient epilog"):
        fusing.linear_grads(dy, x, w, "DRELU")


def test_linear_xent_has_no_fused_form_on_numpy_but_checks_where_one_may_exist():
    """``linear_xent`` (an output layer's forward and loss as one call): None at once on
    NumPy, counting nothing and checking nothing; a backend that may fuse (NumPy told so,
    its ``_linear_xent`` still None) first refuses what ``linear`` would refuse."""
    rng = np.random.default_rng(1)
    x, w, labels = rand(rng, 4, 5), rand(rng, 3, 5), np.array([0, 2, 1, 2])
    before = be.calls.copy()
    assert not be.fuses_xent
    assert be.linear_xent(x, w, None, labels) is None
    assert be.linear_xent(x, rand(rng, 3, 7), None, labels) is None  # not looked at
    assert be.calls == before

    class MayFuse(type(be)):
        fuses_xent = True

    fusing = MayFuse()
    assert fusing.linear_xent(x, w, rand(rng, 3), labels) is None
    with pytest.raises(BackendError, match="linear_xent"):
        fusing.linear_xent(x, rand(rng, 3, 7), None, labels)


def test_drelu_is_a_select_even_for_non_finite_gradients():
    """mask ? dx : 0 (cuBLASLt), not dx * mask: an inf where the mask is clear gives 0."""
    pre = np.array([[-1.0, 2.0, -3.0]])
    _, aux = be.activation(pre, "relu")
    dy = np.array([[np.inf, 1.0, np.nan]])
    np.testing.assert_array_equal(be.activation_grad(dy, "relu", aux), [[0.0, 1.0, 0.0]])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_relu_and_drelu_zeros_are_positive_in_every_dtype_and_path(dtype):
    """Bit for bit means the sign of zero too: a masked-off gradient is +0.0 (the CUDA
    kernels' select), whether or not some gradient is non-finite (a float multiply by the
    mask left -0.0 for negative ones), an unmasked -0.0 stays, and ReLU(-0.0) is +0.0 in
    every dtype (NumPy's float16 maximum keeps -0.0)."""
    from fuseflow._dtypes import bfloat16

    dt = bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(7)
    pre = rng.standard_normal((5, 21)).astype(dt)
    pre[0, :3] = [-0.0, 0.0, -1.0]
    y, aux = be.activation(pre, "relu")
    assert not np.signbit(y.astype(np.float64)).any()
    for bad in (None, np.inf, np.nan):
        dy = rng.standard_normal((5, 21)).astype(dt)
        dy[1, 4] = -0.0
        if bad is not None:
            dy[2, 5] = bad
        dx = be.activation_grad(dy, "relu", aux)
        keep = pre.astype(np.float64) >= 0
        expected = np.where(keep, dy.astype(np.float64), 0.0)
        np.testing.assert_array_equal(dx.astype(np.float64), expected)
        np.testing.assert_array_equal(np.signbit(dx.astype(np.float64)), np.signbit(expected))
    w = rng.standard_normal((3, 21)).astype(dt)  # a matmul's fused DRELU: the same select
    dx, _ = be.linear_dgrad(rng.standard_normal((5, 3)).astype(dt), w, "DRELU", aux)
    assert not np.signbit(dx.astype(np.float64)[~keep]).any()


def test_asarray_takes_cpu_dlpack_producers_as_numpy_including_pinned_memory():
    """Pinned host memory (DLPack kDLCUDAHost) is CPU memory: it becomes NumPy, as the
    docstring of ``ff.asarray`` says, and does not need a GPU."""
    import fuseflow as ff

    a = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)

    class Producer:
        def __init__(self, device_type):
            self.device_type = device_type

        def __dlpack__(self, **kwargs):
            return a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return (self.device_type, 0)

    for device_type in (1, 3):  # kDLCPU, kDLCUDAHost
        x = ff.asarray(Producer(device_type))
        assert isinstance(x, np.ndarray)
        np.testing.assert_array_equal(x, a)
