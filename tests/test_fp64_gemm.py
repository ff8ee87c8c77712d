"""The FP64 route of full-float32 matmuls (``CudaBackend.fp64_gemm_max_macs``).

Small float32 forward and input-gradient matmuls run on the FP64 tensor cores: operands
cast to float64, a COMPUTE_64F matmul, each result rounded to float32 before the bias/ReLU
epilog. A float64 sum of float32 products is far more exact than float32 rounding, so the
result must be the correctly rounded float32 product in nearly every element (and closer
to the float64 reference than the float32 path's tolerance), with the epilog of that
rounded value: bias added in float32, the ReLU mask from its sign, the bias gradient the
float32 column sums of the masked float32 input gradient.
"""

from __future__ import annotations

import numpy as np
import pytest

from fuseflow.backend.epilogs import relu_aux_rows
from fuseflow.backend.numpy_backend import pack_relu_aux, unpack_relu_aux

cupy = pytest.importorskip("cupy")
pytest.importorskip("nvmath")
pytestmark = pytest.mark.gpu

# (batch, in, out): the medium MNIST model's layers, ragged batches, one aux byte (the
# route needs the epilog's features, out or in, to be a multiple of 8)
SHAPES = [(256, 784, 1024), (256, 1024, 1024), (37, 96, 24), (5, 16, 8), (300, 64, 200)]
#: elements allowed to differ from the correctly rounded float32 value (ties of the
#: float64 sum's rounding, far rarer than this in practice)
MISMATCH = 1e-4


@pytest.fixture(scope="module")
def CudaBackend():
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA device")
    from fuseflow.backend.cuda_backend import CudaBackend

    return CudaBackend


@pytest.fixture(scope="module")
def be(CudaBackend):
    b = CudaBackend(tf32=False, autotune=False)
    b.fp64_gemm_max_macs = 2 ** 62
    b.fp64_gemm_ops = {"forward", "dgrad", "wgrad"}
    b.skinny_max = 0  # the route for narrow layers too
    b.own_gemm_max_macs = 0
    return b


def _taken(be, fn):
    before = be.stats()["fp64_gemm"]
    out = fn()
    assert be.stats()["fp64_gemm"] == before + 1, "the FP64 route was not taken"
    return out


def _rounded(a, b):
    """The correctly rounded float32 product of float32 ``a @ b`` (float64 is exact enough)."""
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)


def _mostly_equal(what, got, ref):
    got = cupy.asnumpy(got)
    assert got.dtype == np.float32 and got.shape == ref.shape
    bad = np.count_nonzero(got != ref)
    assert bad <= MISMATCH * ref.size, f"{what}: {bad} of {ref.size} elements differ"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("epilog", ["RELU_AUX_BIAS", "BIAS", "RELU_AUX", "DEFAULT"])
def test_forward_is_the_rounded_product_then_the_epilog(be, rng, shape, epilog):
    batch, fin, fout = shape
    x = rng.standard_normal((batch, fin)).astype(np.float32)
    w = (rng.standard_normal((fout, fin)) / np.sqrt(fin)).astype(np.float32)
    b = rng.standard_normal(fout).astype(np.float32) if "BIAS" in epilog else None
    y, aux = _taken(be, lambda: be.linear(cupy.asarray(x), cupy.asarray(w),
                                          None if b is None else cupy.asarray(b), epilog))
    pre = _rounded(x, w.T) + (b if b is not None else np.float32(0))
    ref = np.maximum(pre, 0) if "RELU" in epilog else pre
    _mostly_equal("y", y, ref)
    if "AUX" in epilog:
        assert aux.shape == (relu_aux_rows(fout), batch)
        bits = unpack_relu_aux(cupy.asnumpy(aux), fout)  # (batch, out), bit set: pre >= 0
        bad = np.count_nonzero(bits != (pre >= 0))
        assert bad <= MISMATCH * pre.size, f"relu_aux: {bad} bits off the rounded pre's sign"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("epilog", ["DRELU_BGRAD", "DRELU", "DEFAULT"])
def test_input_gradient_masks_the_rounded_product(be, rng, shape, epilog):
    batch, features, out = shape
    dy = rng.standard_normal((batch, out)).astype(np.float32)
    w = (rng.standard_normal((out, features)) / np.sqrt(out)).astype(np.float32)
    mask = rng.random((batch, features)) < 0.6
    # relu_aux of a pre-activation whose sign is the mask (its bits: pre >= 0)
    aux = cupy.asarray(pack_relu_aux(np.where(mask, 1.0, -1.0))) if "DRELU" in epilog \
        else None
    dx, db = _taken(be, lambda: be.linear_dgrad(cupy.asarray(dy), cupy.asarray(w), epilog,
                                                aux))
    ref = _rounded(dy, w)
    if "DRELU" in epilog:
        ref = np.where(mask, ref, np.float32(0))
    _mostly_equal("dx", dx, ref)
    if epilog == "DRELU_BGRAD":
        # float32 column sums of the float32 dx, in the kernel's order: compare to float64
        got = cupy.asnumpy(db).astype(np.float64)
        want = cupy.asnumpy(dx).astype(np.float64).sum(axis=0)
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    else:
        assert db is None


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_weight_gradient_is_the_rounded_product(be, rng, shape):
    batch, fin, fout = shape
    dy = rng.standard_normal((batch, fout)).astype(np.float32)
    x = rng.standard_normal((batch, fin)).astype(np.float32)
    dw, db = _taken(be, lambda: be.linear_wgrad(cupy.asarray(dy), cupy.asarray(x), "BGRADB"))
    _mostly_equal("dw", dw, _rounded(dy.T, x))
    np.testing.assert_allclose(cupy.asnumpy(db), dy.astype(np.float64).sum(0), rtol=1e-5,
                               atol=1e-5)


def test_the_route_is_more_exact_than_float32(CudaBackend, be, rng):
    """At the medium model's layer 2: against float64, the route's error is float32's
    rounding alone; the SIMT float32 path adds its accumulation error on top."""
    simt = CudaBackend(tf32=False, autotune=False)
    simt.fp64_gemm_max_macs = 0
    x = rng.standard_normal((256, 1024)).astype(np.float32)
    w = (rng.standard_normal((1024, 1024)) / 32).astype(np.float32)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    errs = {}
    for name, b in (("fp64", be), ("simt", simt)):
        y, _ = b.linear(cupy.asarray(x), cupy.asarray(w), None, "DEFAULT")
        errs[name] = np.linalg.norm(cupy.asnumpy(y) - ref) / np.linalg.norm(ref)
    assert errs["fp64"] <= 4e-8, errs  # half an ulp of float32 at most, on average less
    assert errs["fp64"] < errs["simt"], errs


def test_the_route_is_off_by_default_and_for_tf32_large_or_unaligned_shapes(CudaBackend, rng):
    b = CudaBackend(tf32=False, autotune=False)
    x = cupy.asarray(rng.standard_normal((64, 40)).astype(np.float32))
    w = cupy.asarray(rng.standard_normal((48, 40)).astype(np.float32))
    b.linear(x, w, None, "DEFAULT")
    assert b.stats()["fp64_gemm"] == 0  # off unless asked for
    b.fp64_gemm_max_macs = 2 ** 30
    x = cupy.asarray(rng.standard_normal((64, 40)).astype(np.float32))
    w = cupy.asarray(rng.standard_normal((44, 40)).astype(np.float32))  # 44 % 8 != 0
    b.linear(x, w, None, "DEFAULT")
    assert b.stats()["fp64_gemm"] == 0
    w = cupy.asarray(rng.standard_normal((48, 40)).astype(np.float32))
    b.linear(x, w, None, "DEFAULT")
    assert b.stats()["fp64_gemm"] == 1
    b.fp64_gemm_max_macs = 64 * 40 * 48 - 1
    b.linear(x, w, None, "DEFAULT")
    assert b.stats()["fp64_gemm"] == 1
    b.fp64_gemm_max_macs = 2 ** 30
    b.tf32 = True
    b.linear(x, w, None, "DEFAULT")
    assert b.stats()["fp64_gemm"] == 1
    b.tf32 = False
    b.linear(x.astype(cupy.float16), w.astype(cupy.float16), None, "DEFAULT")
    assert b.stats()["fp64_gemm"] == 1
