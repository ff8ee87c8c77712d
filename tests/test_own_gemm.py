"""fuseflow's own full-float32 matmul (``_cuda_gemm``, opt-in) against float64 NumPy references.

Every launch shape it can take (tile shapes, K splits finished by the last-arriving block or
added within a thread-block cluster, row tiles whose bias-gradient partials are added by the
last tile of a column strip) must
give the product and the epilog of the reference, the same bits on a second call (the
arrival counters are left at zero, the sums run in a fixed order), and the same results
through the backend as the cuBLASLt path.
"""

from __future__ import annotations


import numpy as np
import pytest

from fuseflow.backend.epilogs import relu_aux_rows
from fuseflow.backend.numpy_backend import pack_relu_aux, unpack_relu_aux
from tests.reference import rel_err

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

TOL = 2e-6   # relative (norm) error of a float32 product against float64
SIGN_MARGIN = 1e-4
# (M, N, K): ragged in every direction, one tile, the medium MNIST model's layers, K < 8
SHAPES = [(100, 196, 52), (64, 128, 8), (256, 1024, 784), (33, 20, 1000), (7, 12, 4),
          (300, 36, 1024)]
LAUNCHES = [dict(), dict(warps=(1, 2), splits=1), dict(warps=(4, 2), splits=3, bk=8),
            dict(warps=(2, 1), splits=7), dict(warps=(2, 2), splits=2, bk=8),
            # K splits added in a thread-block cluster through distributed shared memory
            dict(warps=(2, 2), splits=4, cluster=True), dict(warps=(2, 1), splits=3, cluster=True),
            dict(warps=(1, 1), splits=8, cluster=True), dict(warps=(1, 2), splits=2, cluster=True),
            # the float64 tensor cores, each m16n8k* shape: alone, split by the last block,
            # in a cluster
            dict(mma="f64", splits=1), dict(mma="f64", warps=(1, 2), splits=3, bk=8, dmma_k=8),
            dict(mma="f64", warps=(2, 1), splits=4, cluster=True, dmma_k=4), dict(mma="f64"),
            dict(mma="f64", splits=2, dmma_k=4), dict(mma="f64", warps=(1, 1), dmma_k=8),
            # 3xTF32 on the TF32 tensor cores: alone, split by the last block, in a cluster
            dict(mma="tf32x3", splits=1), dict(mma="tf32x3"),
            dict(mma="tf32x3", warps=(1, 2), splits=3, bk=8),
            dict(mma="tf32x3", warps=(2, 1), splits=4, cluster=True)]


@pytest.fixture(scope="module")
def G():
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA device")
    from fuseflow.backend import _cuda_gemm

    return _cuda_gemm


def _twice(fn):
    """Run ``fn`` twice; the results must be bitwise equal (fixed-order sums, counters reset)."""
    first = [cupy.asnumpy(a) if a is not None else None for a in fn()]
    second = [cupy.asnumpy(a) if a is not None else None for a in fn()]
    for a, b in zip(first, second):
        assert (a is None and b is None) or np.array_equal(a, b), "results differ between calls"
    return first


@pytest.fixture
def poisoned_bytes(monkeypatch):
    """Every new uint8 array starts as 0xAB (CuPy's pool would often hand back zeros): the
    relu_aux padding must be written, not inherited."""
    real_empty = cupy.empty

    def empty(shape, dtype=float, *args, **kwargs):
        out = real_empty(shape, dtype, *args, **kwargs)
        if np.dtype(dtype) == np.uint8:
            out.fill(0xAB)
        return out

    monkeypatch.setattr(cupy, "empty", empty)


@pytest.mark.parametrize("launch", LAUNCHES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("epilog", ["relu_aux_bias", "bias", "relu_aux", "plain"])
def test_forward(G, rng, shape, epilog, launch, poisoned_bytes):
    m, n, k = shape
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) if "bias" in epilog else None
    relu = "relu" in epilog
    rows = relu_aux_rows(n) if relu else None
    dx, dw, dbias = cupy.asarray(x), cupy.asarray(w), None if b is None else cupy.asarray(b)
    y, aux = _twice(lambda: G.forward(dx, dw, dbias, relu=relu, aux_rows=rows, **launch))
    pre = x.astype(np.float64) @ w.T.astype(np.float64) + (0 if b is None else b)
    ref = np.maximum(pre, 0) if relu else pre
    assert y.shape == (m, n) and y.dtype == np.float32
    assert rel_err(y, ref) <= TOL, f"{shape} {epilog} {launch}: {rel_err(y, ref):.3g}"
    if relu:
        assert aux.shape == (rows, m)
        sure = np.abs(pre) > SIGN_MARGIN
        assert np.array_equal(unpack_relu_aux(aux, n)[sure], (pre >= 0)[sure])
        used = -(-n // 8)
        assert not aux[used:].any(), "relu_aux padding bytes must be zero"
        if n % 8:  # the bits past the last feature of the last byte are zero too
            assert not (aux[used - 1] >> (n % 8)).any()
    else:
        assert aux is None


@pytest.mark.parametrize("launch", LAUNCHES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("epilog", ["drelu_bgrad", "drelu", "bgrad", "plain"])
def test_dgrad(G, rng, shape, epilog, launch):
    m, n, k = shape          # dy (m, k) @ w (k, n): k is the layer's outputs, n its inputs
    dy = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    mask = rng.random((m, n)) < 0.6
    aux = pack_relu_aux(np.where(mask, 1.0, -1.0)) if "drelu" in epilog else None
    bgrad = "bgrad" in epilog
    daux = None if aux is None else cupy.asfortranarray(cupy.asarray(aux))
    ld = aux.shape[0] if aux is not None else 0
    dx, db = _twice(lambda: G.dgrad(cupy.asarray(dy), cupy.asarray(w), daux, ld, bgrad=bgrad,
                                    **launch))
    prod = dy.astype(np.float64) @ w.astype(np.float64)
    ref = np.where(mask, prod, 0.0) if aux is not None else prod
    assert rel_err(dx, ref) <= TOL * max(1.0, np.linalg.norm(prod)
                                         / max(np.linalg.norm(ref), 1e-30))
    if aux is not None:
        assert not dx[~mask].any(), "masked input gradients must be exact zeros"
    if bgrad:
        # the column sums of the float32 result itself, in float64
        assert rel_err(db, dx.astype(np.float64).sum(0)) <= 1e-5
    else:
        assert db is None


@pytest.mark.parametrize("launch", LAUNCHES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_wgrad(G, rng, shape, launch):
    m, n, k = shape          # dw (m, n) = dy.T (m, k) @ x (k, n): k is the batch
    if m % 4:
        pytest.skip("the weight gradient's output count must be a multiple of 4")
    dy = rng.standard_normal((k, m)).astype(np.float32)
    x = rng.standard_normal((k, n)).astype(np.float32)
    (dw,) = _twice(lambda: (G.wgrad(cupy.asarray(dy), cupy.asarray(x), **launch),))
    assert rel_err(dw, dy.T.astype(np.float64) @ x.astype(np.float64)) <= TOL


def test_cluster_launch_needs_a_tile_that_fits(G, rng):
    x = cupy.asarray(rng.standard_normal((64, 64)).astype(np.float32))
    with pytest.raises(ValueError, match="no cluster launch for warps"):
        G.forward(x, x, None, relu=False, aux_rows=None, warps=(4, 2), splits=2, cluster=True)
    with pytest.raises(ValueError, match="splits be <= 8"):
        G.forward(x, x, None, relu=False, aux_rows=None, warps=(2, 2), splits=16, bk=4,
                  cluster=True)


def test_f64_mma_needs_a_tile_that_fits_and_a_known_name(G, rng):
    x = cupy.asarray(rng.standard_normal((64, 64)).astype(np.float32))
    with pytest.raises(ValueError, match="no float64 tensor-core launch for warps"):
        G.forward(x, x, None, relu=False, aux_rows=None, warps=(4, 2), mma="f64")
    with pytest.raises(ValueError, match="mma must be one of"):
        G.forward(x, x, None, relu=False, aux_rows=None, mma="tf32")
    with pytest.raises(ValueError, match="no 3xTF32 tensor-core launch for warps"):
        G.forward(x, x, None, relu=False, aux_rows=None, warps=(4, 2), mma="tf32x3")
    with pytest.raises(ValueError, match="k-tile must be a multiple"):
        G.forward(x, x, None, relu=False, aux_rows=None, mma="tf32x3", bk=4)
    with pytest.raises(ValueError, match="dmma_k must be one of"):
        G.forward(x, x, None, relu=False, aux_rows=None, mma="f64", dmma_k=16, bk=8)
    with pytest.raises(ValueError, match="dmma_k must be one of"):
        G.forward(x, x, None, relu=False, aux_rows=None, mma="f64", dmma_k=2)


@pytest.mark.parametrize("dmma_k", [4, 8, 16])
@pytest.mark.parametrize("op", ["forward", "dgrad", "wgrad"])
def test_f64_mma_rounds_the_exact_product_once(G, rng, op, dmma_k):
    """Unsplit, the float64 tensor cores' sums of float32 products are exact to far below a
    float32 ulp: every element is the float64 product rounded to float32 (within one ulp,
    for the rare tie-near cases), where float32 sums drift by several."""
    m, n, k = 96, 136, 1000
    a = rng.standard_normal((m, k)).astype(np.float32)
    if op == "forward":
        b = rng.standard_normal((n, k)).astype(np.float32)
        (y,) = _twice(lambda: (G.forward(cupy.asarray(a), cupy.asarray(b), None, relu=False,
                                         aux_rows=None, mma="f64", splits=1,
                                         dmma_k=dmma_k)[0],))
        ref = a.astype(np.float64) @ b.T.astype(np.float64)
    elif op == "dgrad":
        b = rng.standard_normal((k, n)).astype(np.float32)
        (y,) = _twice(lambda: (G.dgrad(cupy.asarray(a), cupy.asarray(b), None, 0, bgrad=False,
                                       mma="f64", splits=1, dmma_k=dmma_k)[0],))
        ref = a.astype(np.float64) @ b.astype(np.float64)
    else:
        a = rng.standard_normal((k, m)).astype(np.float32)  # dy (batch k, m outputs)
        b = rng.standard_normal((k, n)).astype(np.float32)
        (y,) = _twice(lambda: (G.wgrad(cupy.asarray(a), cupy.asarray(b), mma="f64",
                                       splits=1, dmma_k=dmma_k),))
        ref = a.T.astype(np.float64) @ b.astype(np.float64)
    ulps = np.abs(y.astype(np.float64) - ref.astype(np.float32)) / np.spacing(
        np.abs(ref.astype(np.float32)))
    assert ulps.max() <= 1.0, f"{op}: {ulps.max():.1f} ulp from the rounded float64 product"


@pytest.mark.parametrize("op", ["forward", "dgrad", "wgrad"])
def test_tf32x3_is_as_accurate_as_float32_fmas(G, rng, op):
    """3xTF32 keeps about 21 bits of each operand (plain TF32: 11), and the tensor cores'
    truncating sums are added per k-tile with round-to-nearest, so its products carry the
    error of float32 sums, not of TF32: against the float64 product its error is within a
    small factor of the SIMT kernel's on the same operands (summed in the accumulators
    over all of K it was 7-12x), and far below what truncating one operand to TF32
    costs."""
    m, n, k = 256, 1024, 1024
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    run = {"forward": lambda mma: G.forward(cupy.asarray(a), cupy.asarray(b.T.copy()), None,
                                            relu=False, aux_rows=None, mma=mma)[0],
           "dgrad": lambda mma: G.dgrad(cupy.asarray(a), cupy.asarray(b), None, 0,
                                        bgrad=False, mma=mma)[0],
           "wgrad": lambda mma: G.wgrad(cupy.asarray(a.T.copy()), cupy.asarray(b), mma=mma)}
    ref = a.astype(np.float64) @ b.astype(np.float64)
    errors = {mma: rel_err(cupy.asnumpy(run[op](mma)), ref) for mma in ("simt", "tf32x3")}
    tf32 = (a.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
    tf32_error = rel_err(tf32 @ b.astype(np.float64), ref)  # a alone truncated to TF32
    assert errors["tf32x3"] <= 3 * errors["simt"] + 1e-7, errors
    assert errors["tf32x3"] < tf32_error / 1000, (errors, tf32_error)


@pytest.mark.parametrize("mma", ["simt", "f64", "tf32x3"])
def test_backend_routes_float32_and_matches_cublaslt(G, rng, mma):
    """Full float32 dense matmuls run the own kernel (counted); TF32, float16 and a zero
    ``own_gemm_max_macs`` do not; forward, input and weight gradients agree with cuBLASLt."""
    from fuseflow.backend.cuda_backend import CudaBackend

    own = CudaBackend(tf32=False, autotune=False)
    own.own_gemm_max_macs = 2 ** 31  # opt-in
    own.own_gemm_mma = mma
    ref = CudaBackend(tf32=False, autotune=False)
    ref.own_gemm_max_macs = 0
    x = cupy.asarray(rng.standard_normal((256, 784)).astype(np.float32))
    w = cupy.asarray((rng.standard_normal((1024, 784)) / 28).astype(np.float32))
    b = cupy.asarray(rng.standard_normal(1024).astype(np.float32))
    w2 = cupy.asarray((rng.standard_normal((512, 1024)) / 32).astype(np.float32))
    dy = cupy.asarray(rng.standard_normal((256, 512)).astype(np.float32))
    out = {}
    _, aux_ref = ref.linear(x, w, b, "RELU_AUX_BIAS")  # one mask for both input gradients
    for name, be in (("own", own), ("ref", ref)):
        n0 = be.stats()["own_gemm"]
        y, aux = be.linear(x, w, b, "RELU_AUX_BIAS")
        dx, db = be.linear_dgrad(dy, w2, "DRELU_BGRAD", aux_ref)
        dw, _ = be.linear_wgrad(dx, x, "DEFAULT")
        out[name] = [cupy.asnumpy(a) for a in (y, aux, dx, db, dw)]
        assert be.stats()["own_gemm"] - n0 == (3 if name == "own" else 0)
    for i, what in enumerate(("y", "relu_aux", "dx", "dbias", "dw")):
        got, want = out["own"][i], out["ref"][i]
        if what == "relu_aux":
            assert (got != want).mean() < 1e-3  # sign flips only at rounding-level values
        else:
            assert rel_err(got, want.astype(np.float64)) <= 1e-5, what
    for be in (CudaBackend(tf32=True), CudaBackend(tf32=False)):
        be.own_gemm_max_macs = 0 if not be.tf32 else 2 ** 31
        n0 = be.stats()["own_gemm"]
        be.linear(x, w, b, "RELU_AUX_BIAS")
        be.linear(x.astype(np.float16), w.astype(np.float16), b.astype(np.float16),
                  "RELU_AUX_BIAS")
        assert be.stats()["own_gemm"] == n0


def test_unsupported_layouts_fall_back(G, rng):
    """Contiguous extents that are not multiples of 4 (K, the output width, the weight
    gradient's output count) and a misaligned operand go to cuBLASLt, with right results."""
    from fuseflow.backend.cuda_backend import CudaBackend

    be = CudaBackend(tf32=False, autotune=False)
    be.own_gemm_max_macs = 2 ** 31

    def normal(*shape):
        return cupy.asarray(rng.standard_normal(shape).astype(np.float32))

    def ref(a, b):
        return cupy.asnumpy(a).astype(np.float64) @ cupy.asnumpy(b).astype(np.float64)

    x30, w30 = normal(64, 30), normal(40, 30)        # K = 30
    x40, w42 = normal(64, 40), normal(42, 40)        # 42 outputs
    flat = normal(64 * 40 + 1)
    x_off = flat[1:].reshape(64, 40)                  # contiguous, 4 bytes past 16-aligned
    w44 = normal(44, 40)                              # 44 outputs: supported when aligned
    dy34 = normal(64, 34)                             # weight gradient of 34 outputs
    n0 = be.stats()["own_gemm"]
    cases = [(be.linear(x30, w30, None, "DEFAULT")[0], ref(x30, w30.T)),
             (be.linear(x40, w42, None, "DEFAULT")[0], ref(x40, w42.T)),
             (be.linear(x_off, w44, None, "DEFAULT")[0], ref(x_off, w44.T)),
             (be.linear_wgrad(dy34, x40, "DEFAULT")[0], ref(dy34.T, x40))]
    assert be.stats()["own_gemm"] == n0
    for got, want in cases:
        assert rel_err(cupy.asnumpy(got), want) <= TOL
    y, _ = be.linear(x40, w44, None, "DEFAULT")       # aligned: the own kernel
    assert be.stats()["own_gemm"] == n0 + 1
    assert rel_err(cupy.asnumpy(y), ref(x40, w44.T)) <= TOL


@pytest.mark.parametrize("mma", ["simt", "f64", "tf32x3"])
def test_compiled_step_with_the_own_matmul_matches_eager(G, monkeypatch, mma):
    """``ff.compile`` captures the own matmul (workspaces from the step's pool, arrival
    counters made in the warm-up on the capture stream): the same losses as the eager step."""
    import fuseflow as ff
    from tests.test_compile import check_compiled_matches_eager

    be = ff.backend.get("cuda")
    monkeypatch.setattr(be, "own_gemm_max_macs", 2 ** 31)
    monkeypatch.setattr(be, "own_gemm_mma", mma)
    check_compiled_matches_eager("own_gemm")
