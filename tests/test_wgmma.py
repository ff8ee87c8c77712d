"""The 3xTF32 ``wgmma`` matmul (``_cuda_wgmma``, ``CudaBackend.fp32_wgmma``).

Without a GPU: the K-slice rule, the shared-memory budget, the operand layouts of the
backend's views, a NumPy model of the kernel's arithmetic against the GPU tests' error
bounds, and (where CuPy's NVRTC is installed) every kernel variant compiles for ``sm_90a``
without warnings or spills. On a Hopper GPU: the kernel against the float64 product for
every operand layout, every split, ragged shapes and 1-3 K slices (as accurate as float32
FMAs with the rounded split, and a thousand times better than TF32); the backend's
forward, input and weight gradients with the kernel on against cuBLASLt's float32; and a
compiled step against the eager one.
"""

from __future__ import annotations

import numpy as np
import pytest

from fuseflow.backend import _cuda_wgmma as W
from tests.reference import rel_err

LAYOUTS = [(1, 1), (1, 0), (0, 0), (0, 1)]  # (a_kmajor, b_kmajor): forward, dgrad, wgrad, -


def test_slices_fill_the_gpu_and_keep_slices_deep():
    assert W.slices_for(256, 1024, 784) == 2      # 64 tiles of 64 x 64
    assert W.slices_for(256, 1024, 1024) == 2
    assert W.slices_for(1024, 1024, 256) == 1     # 256 tiles: one wave and more
    assert W.slices_for(64, 64, 4096) == 16       # one tile: K / 256 slices
    assert W.slices_for(64, 64, 100) == 1
    for k in (3076, 4100, 1000, 784):             # never an empty slice
        s = W.slices_for(64, 640, k)
        assert (s - 1) * W._chunk(k, s) < k, (k, s)


@pytest.mark.parametrize("a_kmajor,b_kmajor", LAYOUTS)
def test_shared_memory_fits_two_blocks_an_sm(a_kmajor, b_kmajor):
    assert W.smem_bytes(a_kmajor, b_kmajor) <= W.SMEM_MAX // 2


def _read(view, kmajor, ld, rows, cols, row_major_is_kmajor):
    """The (rows, cols) matrix the kernel reads from ``view``'s first element under the
    layout ``layout`` claims (rows x cols = A's m x k, or B's k x n)."""
    item = view.itemsize
    if kmajor == row_major_is_kmajor:       # unit stride along cols
        strides = (ld * item, item)
    else:                                   # unit stride along rows
        strides = (item, ld * item)
    return np.lib.stride_tricks.as_strided(view, (rows, cols), strides)


def test_layout_reads_the_backend_stage_views(rng):
    """The views the backend hands the kernel (forward ``x @ w.T``, input gradient
    ``dy @ w``, weight gradient ``dy.T @ x``) are read element for element as themselves
    under the layout ``layout`` derives from their strides; a view with no unit stride
    is refused."""
    batch, fin, fout = 12, 20, 8
    x = rng.standard_normal((batch, fin)).astype(np.float32)
    w = rng.standard_normal((fout, fin)).astype(np.float32)
    dy = rng.standard_normal((batch, fout)).astype(np.float32)
    w_dgrad = rng.standard_normal((fout, fin)).astype(np.float32)
    cases = {"forward": (x, w.T, (1, fin, 1, fin)), "dgrad": (dy, w_dgrad, (1, fout, 0, fin)),
             "wgrad": (dy.T, x, (0, fout, 0, fin))}
    for stage, (a, b, want) in cases.items():
        m, n, k, a_kmajor, lda, b_kmajor, ldb = W.layout(a, b)
        assert (m, n, k) == (a.shape[0], b.shape[1], a.shape[1])
        assert (a_kmajor, lda, b_kmajor, ldb) == want, stage
        # A(m, k): K-major means unit stride along k; B(k, n): K-major means unit stride
        # along k, the rows of this (k, n) matrix
        np.testing.assert_array_equal(_read(a, a_kmajor, lda, m, k, 1), a, err_msg=stage)
        np.testing.assert_array_equal(_read(b, b_kmajor, ldb, k, n, 0), b, err_msg=stage)
    assert W.layout(x[:, ::2], w[:, ::2].T) is None


def _bound(split, fp32):
    """The kernel's allowed relative error against float64, given NumPy float32's ``fp32``:
    the rounded split measured 2.4-2.5e-7 at the medium shapes (float32's 1.6-2.9e-7), the
    chopped one 5.4-5.6e-7 whatever K (calls 193-194). "3xtf32-lotrunc" is held to the
    rounded split's bound: the model gives them the same error."""
    return max(8 * fp32, 1e-6) if split == "3xtf32-chop" else max(3 * fp32, 4e-7)


def _tf32(bits, rounded, guard=False):
    """float32 bit patterns (uint32) to TF32 ones: rounded to nearest, ties away from zero
    (half a TF32 unit added to the magnitude), or the tensor cores' own read of a float32
    operand (the low 13 bits dropped). ``guard``: as ``cvt.rna.tf32.f32`` does on sm_90,
    infinities and NaNs are kept as they are (the kernel rounds lo so; its hi is rounded
    without the guard, which changes nothing but a NaN's hi)."""
    if rounded:
        added = bits + np.uint32(0x1000)
        bits = np.where((bits & np.uint32(0x7F800000)) == 0x7F800000, bits, added) if guard \
            else added
    return bits & np.uint32(0xFFFFE000)


def _split(x, chop):
    """The kernel's ``split_tf32`` on float32 ``x`` (``chop``: its CHOP, the values of
    ``W.SPLITS``; 0 rounds hi and lo, 1 chops both, 2 only lo): (hi, lo) as the tensor
    cores use them."""
    bits = x.view(np.uint32)
    hi = _tf32(bits, rounded=chop != 1).view(np.float32)
    with np.errstate(invalid="ignore"):
        lo = (x - hi).view(np.uint32)                # exact: hi holds x's top bits
    return hi, _tf32(lo, rounded=chop == 0, guard=True).view(np.float32)


def _rna_reference(x):
    """float32 ``x`` rounded to TF32 (10 fraction bits), to nearest with ties away from
    zero, in float64 arithmetic: the reference the bit trick is checked against."""
    x64 = np.abs(x.astype(np.float64))
    finite = np.where(np.isinf(x64) | (x64 == 0), 1.0, x64)
    ulp = np.exp2(np.maximum(np.floor(np.log2(finite)), -126.0) - 10)
    with np.errstate(over="ignore"):
        r = (np.floor(x64 / ulp + 0.5) * ulp).astype(np.float32)
    return np.copysign(r, x)


def test_hi_rounding_bit_trick_is_round_to_nearest_ties_away(rng):
    """The kernel rounds hi as ``(bits + 0x1000) & ~0x1fff``, without ``cvt.rna``'s guard
    (two SASS instructions instead of four). Against float64 arithmetic, it is TF32 rounding
    to nearest, ties away, for every float32 but a NaN: normal and subnormal values, exact
    ties, values that round up into the next binade, past float32's largest (to
    infinity), and infinities themselves."""
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    ties = (bits & np.uint32(0xFFFFE000)) | np.uint32(0x1000)
    edges = np.array([0, 0x1, 0x1000, 0x00800000, 0x3F7FF000, 0x3F7FFFFF, 0x7F7FEFFF,
                      0x7F7FF000, 0x7F7FFFFF, 0x7F800000], np.uint32)
    bits = np.concatenate([bits, ties, edges, edges | np.uint32(0x80000000)])
    x = bits.view(np.float32)
    keep = ~np.isnan(x)
    got = _tf32(bits[keep], rounded=True).view(np.float32)
    np.testing.assert_array_equal(got, _rna_reference(x[keep]))
    assert np.array_equal(_tf32(bits[keep], True), _tf32(bits[keep], True, guard=True))


@pytest.mark.parametrize("split", sorted(W.SPLITS))
def test_a_nan_operand_reaches_the_product_through_lo(split):
    """For a NaN, the unguarded hi may be any number (0x7fffffff, CUDA's NaN, becomes -0),
    but lo = x - hi is NaN, so each product that reads the NaN is NaN in the model."""
    x = np.array([np.nan, -np.nan, 1.5], np.float32)
    x.view(np.uint32)[0] = 0x7FFFFFFF
    hi, lo = _split(x, W.SPLITS[split])
    assert np.isnan(lo[:2]).all() and not np.isnan(lo[2])
    a = np.ones((3, 16), np.float32)
    a[1, 5] = x[0]
    with np.errstate(invalid="ignore"):
        out = _model(a, np.ones((16, 4), np.float32), split)
    assert np.isnan(out[1]).all() and not np.isnan(out[[0, 2]]).any()


def _toward_zero(x):
    """float64 ``x`` rounded to float32 toward zero, as the tensor cores' adds round."""
    f = x.astype(np.float32)
    over = np.abs(f.astype(np.float64)) > np.abs(x)
    f[over] = np.nextafter(f[over], np.float32(0))
    return f


def _model(a, b, split, bk=W.BK):
    """A NumPy model of one K slice of the kernel's arithmetic. Per k-tile of ``bk``, a fresh
    accumulator takes the three TF32 products lo*hi, hi*lo, hi*hi of each group of 8 k (one
    ``wgmma`` each, the 8 products summed exactly) rounded toward zero, then the k-tile's
    sum is added to the float32 accumulator, rounded to nearest. Rounding every ``wgmma``
    toward zero errs on the pessimistic side: this model gave 3.0e-7 (rounded split) and
    5.8e-7 (chopped) at the medium shapes where the H100 measured 2.4-2.5e-7 and 5.4-5.6e-7
    (calls 193-194)."""
    (ah, al), (bh, bl) = _split(a, W.SPLITS[split]), _split(b, W.SPLITS[split])
    ah, al, bh, bl = (t.astype(np.float64) for t in (ah, al, bh, bl))
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k0 in range(0, a.shape[1], bk):
        fresh = np.zeros_like(acc)
        for k8 in range(k0, min(k0 + bk, a.shape[1]), 8):
            g = slice(k8, k8 + 8)
            for x, y in ((al, bh), (ah, bl), (ah, bh)):
                fresh = _toward_zero(fresh.astype(np.float64) + x[:, g] @ y[g])
        acc = acc + fresh
    return acc


@pytest.mark.parametrize("split", sorted(W.SPLITS))
@pytest.mark.parametrize("m,n,k", [(256, 1024, 784), (100, 68, 200), (64, 64, 40)])
def test_modelled_arithmetic_fits_the_gpu_tests_bounds(rng, m, n, k, split):
    """The error bounds ``test_kernel_matches_float64`` holds the GPU to admit a pessimistic
    model of the kernel's arithmetic (``_model``), so that a failure there is the kernel's,
    not the split's; and the three products are what makes it float32-accurate: one TF32
    product (hi*hi) is more than a hundred times worse."""
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = rel_err(_model(a, b, split).astype(np.float64), ref)
    assert err <= _bound(split, rel_err(a @ b, ref)), (err, rng.seed)
    hi = [_split(t, chop=0)[0].astype(np.float64) for t in (a, b)]
    assert err < rel_err(hi[0] @ hi[1], ref) / 100


def test_truncating_only_lo_costs_no_accuracy_in_the_model(rng):
    """Why "3xtf32-lotrunc" exists: with hi rounded to nearest, lo's sign is x's or not at
    random, so the tensor cores truncating lo adds no bias, and the model's error is the
    rounded split's (3.02e-7 for both at the first layer's forward, 256 x 1024 x 784),
    while chopping hi too makes every lo carry x's sign and doubles it (5.79e-7)."""
    a = rng.standard_normal((128, 256)).astype(np.float32)
    b = rng.standard_normal((256, 256)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = {s: rel_err(_model(a, b, s).astype(np.float64), ref) for s in W.SPLITS}
    assert err["3xtf32-lotrunc"] < 1.1 * err["3xtf32"], (err, rng.seed)
    assert err["3xtf32-chop"] > 1.5 * err["3xtf32"], (err, rng.seed)


def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
        return True
    except Exception:  # noqa: BLE001 - no NVRTC: nothing to compile with
        return False


@pytest.mark.skipif(not _nvrtc(), reason="needs CuPy's NVRTC")
@pytest.mark.parametrize("split", sorted(W.SPLITS))
@pytest.mark.parametrize("a_kmajor,b_kmajor", LAYOUTS)
def test_every_variant_compiles_for_sm90a(a_kmajor, b_kmajor, split):
    cubin, log = W.compile_cubin(W.source(a_kmajor, b_kmajor, W.SPLITS[split]), verbose=True)
    assert cubin[:4] == b"\x7fELF"
    assert "warning" not in log.lower(), log
    assert "0 bytes spill stores" in log, log


def _hopper():
    import fuseflow as ff

    return ff.backend.cuda_available() and W.available()


hopper = pytest.mark.skipif("not _hopper()", reason="needs a compute capability 9.0 GPU")


def _operand(cp, rng, rows, cols, kmajor_rows):
    """A (rows, cols) float32 matrix and its device copy laid out row-major when
    ``kmajor_rows`` (the kernel reads it as [row * ld + col]) else column-major."""
    host = rng.standard_normal((rows, cols)).astype(np.float32)
    return host, _on_device(cp, host, kmajor_rows)


def _on_device(cp, host, kmajor_rows):
    """``host``'s device copy, row-major when ``kmajor_rows`` else column-major."""
    dev = cp.asarray(host)
    return dev if kmajor_rows else cp.asfortranarray(dev)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("split", sorted(W.SPLITS))
@pytest.mark.parametrize("a_kmajor,b_kmajor", LAYOUTS)
@pytest.mark.parametrize("m,n,k,slices", [(256, 1024, 784, 2), (100, 68, 200, 1),
                                          (132, 196, 1000, 3), (64, 64, 32, 1),
                                          (64, 64, 40, 3)])     # slice 2 empty: zeros
def test_kernel_matches_float64(cp, rng, m, n, k, slices, a_kmajor, b_kmajor, split):
    a, a_dev = _operand(cp, rng, m, k, a_kmajor)          # A(m, k)
    bt, bt_dev = _operand(cp, rng, n, k, b_kmajor)        # B(k, n) = bt(n, k)
    lda = k if a_kmajor else m
    ldb = k if b_kmajor else n
    out = cp.full((slices, m, n), np.nan, dtype=cp.float32)
    W.product(a_dev, bt_dev, out, m, n, k, lda, ldb, a_kmajor=a_kmajor, b_kmajor=b_kmajor,
              slices=slices, split=split)
    got = cp.asnumpy(out).astype(np.float64).sum(axis=0)
    ref = a.astype(np.float64) @ bt.T.astype(np.float64)
    fp32 = rel_err(a @ bt.T, ref)                            # NumPy's float32 FMAs
    tf32 = _tf32(a.view(np.uint32), rounded=False).view(np.float32)  # a chopped to TF32
    assert not np.isnan(got).any(), f"seed {rng.seed}"
    err = rel_err(got, ref)
    assert err <= _bound(split, fp32), (err, fp32, rng.seed)
    assert err < rel_err(tf32.astype(np.float64) @ bt.T.astype(np.float64), ref) / 100


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("split", sorted(W.SPLITS))
@pytest.mark.parametrize("a_kmajor,b_kmajor", LAYOUTS)
def test_kernel_carries_a_nan_operand(cp, rng, a_kmajor, b_kmajor, split):
    """hi is rounded without cvt.rna's NaN guard: a NaN (CUDA's own, 0x7fffffff, whose hi
    becomes -0) must still reach every output it feeds, through lo, and no other."""
    m, n, k = 100, 68, 200
    a = rng.standard_normal((m, k)).astype(np.float32)
    bt = rng.standard_normal((n, k)).astype(np.float32)
    a.view(np.uint32)[3, 7] = bt.view(np.uint32)[5, 150] = 0x7FFFFFFF
    a_dev, bt_dev = _on_device(cp, a, a_kmajor), _on_device(cp, bt, b_kmajor)
    out = cp.zeros((1, m, n), dtype=cp.float32)
    W.product(a_dev, bt_dev, out, m, n, k, k if a_kmajor else m, k if b_kmajor else n,
              a_kmajor=a_kmajor, b_kmajor=b_kmajor, slices=1, split=split)
    expect = np.zeros((m, n), bool)
    expect[3, :] = expect[:, 5] = True
    np.testing.assert_array_equal(np.isnan(cp.asnumpy(out[0])), expect)


@pytest.fixture
def pair(cp):
    """A CudaBackend with the kernel on and one with it off (cuBLASLt's float32)."""
    from fuseflow.backend.cuda_backend import CudaBackend

    pair = CudaBackend(tf32=False, autotune=False), CudaBackend(tf32=False, autotune=False)
    for be, setting in zip(pair, (W.DEFAULT_SPLIT, "off")):
        be.fp32_wgmma = setting
        be.own_epilog = "all"  # the own-epilog paths whatever FUSEFLOW_OWN_EPILOG[_MIN] say
        be.k_splits = "auto"   # the kernel's own slice counts, whatever FUSEFLOW_K_SPLITS says
        be.own_gemm_max_macs = 0  # no product to the own SIMT matmul
    return pair


@pytest.mark.gpu
@hopper
def test_backend_routes_dense_products_and_matches_cublaslt(cp, rng, pair):
    """The medium model's products (own-epilog forward with bias/ReLU/relu_aux, ReLU input
    gradient with the bias gradient, weight gradients with and without BGRADB) run the
    kernel (counted) and agree with cuBLASLt's float32 to float32 rounding."""
    on, off = pair
    x = cp.asarray(rng.standard_normal((256, 784)).astype(np.float32))
    w1 = cp.asarray((rng.standard_normal((1024, 784)) / 28).astype(np.float32))
    b1 = cp.asarray(rng.standard_normal(1024).astype(np.float32))
    w2 = cp.asarray((rng.standard_normal((1024, 1024)) / 32).astype(np.float32))
    dy = cp.asarray(rng.standard_normal((256, 1024)).astype(np.float32))
    _, aux_ref = off.linear(x, w1, b1, "RELU_AUX_BIAS")
    out = {}
    for name, be in (("on", on), ("off", off)):
        n0 = be.stats()["wgmma"]
        y, aux = be.linear(x, w1, b1, "RELU_AUX_BIAS")
        dx, db = be.linear_dgrad(dy, w2, "DRELU_BGRAD", aux_ref)
        dw, _ = be.linear_wgrad(dx, x, "DEFAULT")
        dw2, db2 = be.linear_wgrad(dy, y, "BGRADB")
        out[name] = [cp.asnumpy(a) for a in (y, aux, dx, db, dw, dw2, db2)]
        assert be.stats()["wgmma"] - n0 == (4 if name == "on" else 0)
    for i, what in enumerate(("y", "relu_aux", "dx", "dbias", "dw", "dw2", "dbias2")):
        got, want = out["on"][i], out["off"][i]
        if what == "relu_aux":
            assert (got != want).mean() < 1e-3  # sign flips only at rounding-level values
        else:
            assert rel_err(got, want.astype(np.float64)) <= 1e-5, (what, rng.seed)


@pytest.mark.gpu
@hopper
def test_one_slice_products_take_their_epilog_in_place(cp, rng, pair):
    """Where the kernel does not split K, the bias/ReLU pass and the ReLU-gradient pass
    rewrite its product in place: a layer allocates no (M, N) plane beside its output (at
    batch 8192 the 784-4096-4096-10 step's 134 MB), and still matches cuBLASLt's float32."""
    on, off = pair
    m, k, n = 2048, 512, 1024
    assert W.slices_for(m, n, k) == W.slices_for(m, n, n) == 1  # 512 tiles: no K split
    x = cp.asarray(rng.standard_normal((m, k)).astype(np.float32))
    w1 = cp.asarray((rng.standard_normal((n, k)) / 23).astype(np.float32))
    b1 = cp.asarray(rng.standard_normal(n).astype(np.float32))
    w2 = cp.asarray((rng.standard_normal((n, n)) / 32).astype(np.float32))
    dy = cp.asarray(rng.standard_normal((m, n)).astype(np.float32))
    plane = m * n * 4
    y_ref, aux = off.linear(x, w1, b1, "RELU_AUX_BIAS")
    dx_ref, db_ref = off.linear_dgrad(dy, w2, "DRELU_BGRAD", aux)
    n0 = on.stats()["wgmma"]
    for op in ("forward", "dgrad"):
        pool = cp.cuda.MemoryPool()
        with cp.cuda.using_allocator(pool.malloc):
            if op == "forward":
                got = on.linear(x, w1, b1, "RELU_AUX_BIAS")
                want = (y_ref, aux)
            else:
                got = on.linear_dgrad(dy, w2, "DRELU_BGRAD", aux)
                want = (dx_ref, db_ref)
            cp.cuda.get_current_stream().synchronize()
        # the output plane, the relu_aux (F/8 bytes a row) or the bias gradient: no second
        assert plane <= pool.total_bytes() < 1.5 * plane, (op, pool.total_bytes(), plane)
        assert rel_err(cp.asnumpy(got[0]), cp.asnumpy(want[0]).astype(np.float64)) <= 1e-5
        if op == "forward":
            assert (cp.asnumpy(got[1]) != cp.asnumpy(want[1])).mean() < 1e-3
        else:
            assert rel_err(cp.asnumpy(got[1]), cp.asnumpy(want[1]).astype(np.float64)) <= 1e-5
    assert on.stats()["wgmma"] - n0 == 2


@pytest.mark.gpu
@hopper
def test_other_dtypes_tf32_and_ragged_extents_stay_on_cublaslt(cp, rng, pair):
    from fuseflow.backend.cuda_backend import CudaBackend

    on, _ = pair
    x = cp.asarray(rng.standard_normal((256, 30)).astype(np.float32))    # K = 30
    w = cp.asarray(rng.standard_normal((1024, 30)).astype(np.float32))
    b = cp.asarray(rng.standard_normal(1024).astype(np.float32))
    y, _ = on.linear(x, w, b, "RELU_AUX_BIAS")
    on.linear_wgrad(cp.asarray(rng.standard_normal((256, 1022)).astype(np.float32)),
                    cp.asarray(rng.standard_normal((256, 784)).astype(np.float32)), "DEFAULT")
    on.linear_wgrad(cp.asarray(rng.standard_normal((256, 1024)), dtype=cp.float64),
                    cp.asarray(rng.standard_normal((256, 784)), dtype=cp.float64), "DEFAULT")
    assert on.stats()["wgmma"] == 0
    pre = cp.asnumpy(x).astype(np.float64) @ cp.asnumpy(w).T + cp.asnumpy(b)
    assert rel_err(cp.asnumpy(y), np.maximum(pre, 0)) < 1e-5
    tf32 = CudaBackend(tf32=True, autotune=False)
    tf32.fp32_wgmma = "3xtf32"
    xs = cp.asarray(rng.standard_normal((256, 784)).astype(np.float32))
    tf32.linear_wgrad(cp.asarray(rng.standard_normal((256, 1024)).astype(np.float32)), xs,
                      "DEFAULT")
    assert tf32.stats()["wgmma"] == 0
    assert (on.fp32_wgmma_in_effect, tf32.fp32_wgmma_in_effect) == (W.DEFAULT_SPLIT, "off")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("split", sorted(W.SPLITS))
def test_compiled_step_with_the_kernel_matches_eager(cp, monkeypatch, split):
    """``ff.compile`` captures the kernel (compiled in the warm-up, before the capture):
    the same losses as the eager step over 20 steps of the medium model."""
    import fuseflow as ff
    from tests.test_compile import check_compiled_matches_eager

    monkeypatch.setattr(ff.backend.get("cuda"), "fp32_wgmma", split)
    check_compiled_matches_eager("wgmma", sizes=(784, 1024, 1024, 10), batch=256)
