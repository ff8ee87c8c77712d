"""bfloat16 compute: the NumPy reference and mixed precision against float64, Adam against
optax, training on real MNIST, and (marked ``gpu``) the CUDA backend against the NumPy
reference.

bfloat16 has float32's exponent range and 8 bits of mantissa (a unit roundoff of 2^-9), so
results are judged at bfloat16's rounding, not float16's.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import fuseflow as ff
from fuseflow import mixed_precision as mp
from fuseflow import nn
from fuseflow.backend.numpy_backend import NumpyBackend, unpack_relu_aux
from tests.reference import same_bits_or_both_nan

BF16 = np.dtype(ml_dtypes.bfloat16)
ULP = 2.0 ** -8  # the spacing of bfloat16 values in [1, 2)


def normal(rng, shape, scale=1.0, dtype=BF16):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def f64(a):
    return np.asarray(a, dtype=np.float64)


def test_bfloat16_is_a_compute_dtype_by_name_and_by_dtype():
    assert ff.bfloat16 == BF16
    for name in ("bfloat16", BF16, ml_dtypes.bfloat16):
        assert mp._compute_dtype(name) == BF16
    with pytest.raises(ValueError, match="bfloat16"):
        mp._compute_dtype("int8")


@pytest.mark.parametrize("epilog", ["RELU_AUX_BIAS", "GELU_AUX_BIAS", "BIAS", "DEFAULT"])
def test_numpy_forward_is_the_exact_product_rounded_once(epilog, rng):
    """y = act(x @ w.T + b) in bfloat16: within one bfloat16 rounding of the float64 result
    (float32 accumulation adds far less), and the ReLU mask is the float64 sign where the
    pre-activation is not within that rounding of 0."""
    nb = NumpyBackend()
    x, w, b = normal(rng, (33, 40)), normal(rng, (24, 40), 40 ** -0.5), normal(rng, (24,))
    y, aux = nb.linear(x, w, b if "BIAS" in epilog else None, epilog)
    assert y.dtype == BF16 and y.shape == (33, 24)
    pre = f64(x) @ f64(w).T + (f64(b) if "BIAS" in epilog else 0)
    if epilog.startswith("RELU"):
        want = np.maximum(pre, 0)
        bits = unpack_relu_aux(aux, 24)
        clear = np.abs(pre) > 1e-4
        np.testing.assert_array_equal(bits[clear], (pre >= 0)[clear])
    elif epilog.startswith("GELU"):
        from fuseflow.backend.numpy_backend import gelu

        want = gelu(pre)
        np.testing.assert_allclose(f64(aux).T, pre, rtol=ULP, atol=1e-6)  # the pre-activation
    else:
        want = pre
    np.testing.assert_allclose(f64(y), want, rtol=ULP, atol=1e-5)


def test_numpy_backward_matches_the_float64_composition(rng):
    """DRELU_BGRAD's dx (the masked product, rounded once) and bias gradient (the column
    sums of that dx), and the weight gradient, against float64."""
    nb = NumpyBackend()
    x, w1, b1 = normal(rng, (50, 30)), normal(rng, (20, 30), 30 ** -0.5), normal(rng, (20,))
    w2, dz = normal(rng, (7, 20), 20 ** -0.5), normal(rng, (50, 7))
    _, aux = nb.linear(x, w1, b1, "RELU_AUX_BIAS")
    dh, db = nb.linear_dgrad(dz, w2, "DRELU_BGRAD", aux)
    mask = unpack_relu_aux(aux, 20)
    want = (f64(dz) @ f64(w2)) * mask
    assert dh.dtype == db.dtype == BF16
    np.testing.assert_allclose(f64(dh), want, rtol=ULP, atol=1e-6)
    np.testing.assert_allclose(f64(db), f64(dh).sum(0), rtol=ULP, atol=1e-5)
    dw, dbw = nb.linear_wgrad(dz, x, "BGRADB")
    np.testing.assert_allclose(f64(dw), f64(dz).T @ f64(x), rtol=ULP, atol=1e-2 * ULP * 50)
    np.testing.assert_allclose(f64(dbw), f64(dz).sum(0), rtol=ULP, atol=1e-5)


def _model(seed=0):
    model = nn.Serial(nn.Dense(64, "relu"), nn.Dense(48, "gelu"), nn.Dense(10))
    _, params = model.init(ff.random.key(seed), (32,))
    rng = np.random.default_rng(seed)
    return model, params, rng.standard_normal((16, 32)).astype(np.float32), np.arange(16) % 10


def test_mixed_precision_grads_match_float64_to_bfloat16_rounding():
    """The bfloat16 forward and backward give the float64 model's loss and gradients (whose
    own checks are finite differences, test_grad_check.py) to a few bfloat16 roundings;
    the gradients come back in the params' float32, the logits in bfloat16, and the error
    is a bfloat16 one (float32 compute would be 1e-6 off, not 1e-3)."""
    model, params, x, y = _model()
    p64 = ff.tree.astype(params, np.float64)
    loss64, g64 = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)(
        p64, x.astype(np.float64), y)
    (loss, logits), g = mp.value_and_grad(model, ff.losses.softmax_cross_entropy, "bfloat16",
                                          with_outputs=True)(
        params, x, y, loss_scale=np.float32(1024))
    assert logits.dtype == BF16
    assert abs(float(loss) - float(loss64)) < 4 * ULP * abs(float(loss64))
    errs = [np.linalg.norm(f64(a) - b) / np.linalg.norm(b)
            for a, b in zip(ff.tree.leaves(g), ff.tree.leaves(g64))]
    assert max(errs) > ULP / 64, errs  # computed in bfloat16, not float32
    for a, b in zip(ff.tree.leaves(g), ff.tree.leaves(g64)):
        assert a.dtype == np.float32
        err = np.linalg.norm(f64(a) - b) / np.linalg.norm(b)
        assert err < 4 * ULP, err


def test_bfloat16_needs_no_loss_scale_where_float16_flushes():
    """Gradients around 1e-8 are below float16's smallest subnormal (6e-8) but well inside
    bfloat16's range: unscaled bfloat16 keeps them, unscaled float16 loses them."""
    model, params, x, y = _model(1)
    tiny = ff.tree.map(lambda p: p * 1e-3, params)
    _, exact = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)(tiny, x, y)
    errs = {}
    for cd in ("float16", "bfloat16"):
        _, g = mp.value_and_grad(model, ff.losses.softmax_cross_entropy, cd)(tiny, x, y)
        errs[cd] = np.linalg.norm(g[0]["w"] - exact[0]["w"]) / np.linalg.norm(exact[0]["w"])
    assert errs["bfloat16"] < 8 * ULP and errs["float16"] > 0.5, errs


def test_step_with_a_bfloat16_compute_copy_matches_the_reference_update():
    """make_step in bfloat16 with dynamic_loss_scaling's compute copy, SGD (whose update
    shows any slip in the unscaling): every step's params are bit for bit the reference
    composition's (the float32 gradients of the scaled loss, unscaled, then
    update_and_apply), the copy stays the params cast to bfloat16, and the loss falls."""
    model, params, x, y = _model(2)
    sgd = ff.optim.sgd(0.3)
    opt = mp.dynamic_loss_scaling(sgd, compute_dtype="bfloat16")
    state = opt.init(params)
    step = ff.train.make_step(model, ff.losses.softmax_cross_entropy, opt,
                              compute_dtype="bfloat16")
    grad_fn = mp.value_and_grad(model, ff.losses.softmax_cross_entropy, "bfloat16")
    ref, ref_state = params, sgd.init(params)
    losses = []
    for _ in range(40):
        _, grads = grad_fn(ref, x, y, loss_scale=state.scale)
        ref, ref_state = ff.optim.update_and_apply(sgd, grads, ref_state, ref)
        params, state, metrics = step(params, state, x, y)
        losses.append(float(metrics["loss"]))
        for p, r, c in zip(ff.tree.leaves(params), ff.tree.leaves(ref),
                           ff.tree.leaves(state.compute_params)):
            np.testing.assert_array_equal(p, r)
            assert c.dtype == BF16
            np.testing.assert_array_equal(c, p.astype(BF16))
    assert losses[-1] < 0.2 * losses[0]


def test_binary_cross_entropy_takes_bfloat16_targets():
    """sigmoid_binary_cross_entropy on bfloat16 logits and targets: the loss and gradient
    of the same values in float32, to bfloat16 rounding."""
    rng = np.random.default_rng(7)
    logits, targets = (rng.standard_normal((32, 1)).astype(BF16),
                       rng.uniform(size=(32, 1)).astype(BF16))
    want, dwant = ff.losses.sigmoid_binary_cross_entropy(logits.astype(np.float32),
                                                         targets.astype(np.float32))
    got, dgot = ff.losses.sigmoid_binary_cross_entropy(logits, targets)
    assert dgot.dtype == BF16
    assert abs(float(got) - float(want)) < 4 * ULP * abs(float(want))
    np.testing.assert_allclose(f64(dgot), f64(dwant), rtol=4 * ULP, atol=1e-5)


def test_step_without_loss_scaling_is_the_unscaled_composition():
    """make_step in bfloat16 with a plain optimizer (no loss scaling): each step is
    mixed precision's value_and_grad (float32 gradients, loss scale 1) followed by
    update_and_apply, bit for bit; float16 still asks for the wrapper."""
    model, params, x, y = _model(5)
    opt = ff.optim.adam(1e-3)
    step = ff.train.make_step(model, ff.losses.softmax_cross_entropy, opt,
                              compute_dtype="bfloat16")
    grad_fn = mp.value_and_grad(model, ff.losses.softmax_cross_entropy, "bfloat16")
    p_ref, s_ref = params, opt.init(params)
    p, s = params, opt.init(params)
    for _ in range(5):
        p, s, metrics = step(p, s, x, y)
        loss, grads = grad_fn(p_ref, x, y)
        assert all(g.dtype == np.float32 for g in ff.tree.leaves(grads))
        p_ref, s_ref = ff.optim.update_and_apply(opt, grads, s_ref, p_ref)
        assert float(metrics["loss"]) == float(loss)
        for a, b in zip(ff.tree.leaves((p, s)), ff.tree.leaves((p_ref, s_ref))):
            np.testing.assert_array_equal(a, b)
    f16 = ff.train.make_step(model, ff.losses.softmax_cross_entropy, opt,
                             compute_dtype="float16")
    with pytest.raises(TypeError, match="no loss scale.*or compute in bfloat16"):
        f16(params, opt.init(params), x, y)


@pytest.mark.parametrize("opt_name", ["sgd", "adam", "momentum"])
def test_compute_copy_step_is_the_unscaled_composition(opt_name, monkeypatch):
    """make_step in bfloat16 with compute_copy (no loss scaling, bfloat16 gradients into the
    update): every step's params, moments and loss are bit for bit those of the plain
    optimizer's unscaled step (float32 gradients, the params cast each step), the update
    sees the gradients in bfloat16, and the copy is the params cast to bfloat16."""
    model, params, x, y = _model(6)
    inner = {"sgd": ff.optim.sgd(0.3), "adam": ff.optim.adam(1e-2),
             "momentum": ff.optim.sgd(0.1, momentum=0.9)}[opt_name]
    opt = mp.compute_copy(inner, "bfloat16")
    step = ff.train.make_step(model, ff.losses.softmax_cross_entropy, opt,
                              compute_dtype="bfloat16")
    ref_step = ff.train.make_step(model, ff.losses.softmax_cross_entropy, inner,
                                  compute_dtype="bfloat16")
    p, s = params, opt.init(params)
    p_ref, s_ref = params, inner.init(params)
    seen = []  # the gradients' dtypes the update is handed first in each step
    fused_update = mp.fused_update

    def spy(opt, grads, *args, **kwargs):
        if kwargs.get("widen_grads"):
            seen.append({g.dtype for g in ff.tree.leaves(grads)})
        return fused_update(opt, grads, *args, **kwargs)

    monkeypatch.setattr(mp, "fused_update", spy)
    losses = []
    for _ in range(25):
        p, s, metrics = step(p, s, x, y)
        p_ref, s_ref, ref_metrics = ref_step(p_ref, s_ref, x, y)
        assert float(metrics["loss"]) == float(ref_metrics["loss"])
        losses.append(float(metrics["loss"]))
        for a, b in zip(ff.tree.leaves((p, s.inner)), ff.tree.leaves((p_ref, s_ref))):
            np.testing.assert_array_equal(a, b)
        for c, a in zip(ff.tree.leaves(s.compute_params), ff.tree.leaves(p)):
            assert c.dtype == BF16
            np.testing.assert_array_equal(c.view(np.uint16), a.astype(BF16).view(np.uint16))
    assert losses[-1] < 0.5 * losses[0]
    assert seen == [{BF16}] * 25


def test_compute_copy_update_matches_the_inner_update_on_widened_grads(rng):
    """opt.update and update_and_apply of the wrapper on bfloat16 gradients: the inner
    optimizer's update of the same gradients in float32, bit for bit, and the new copy is
    the new params cast; float32 gradients are taken as they are."""
    model, params, _, _ = _model(8)
    inner = ff.optim.adam(1e-2)
    opt = mp.compute_copy(inner)
    state = opt.init(params)
    grads = ff.tree.map(lambda p: normal(rng, p.shape), params)
    wide = ff.tree.map(lambda g: g.astype(np.float32), grads)
    want_u, want_s = inner.update(wide, state.inner, params)
    want_p = ff.optim.apply_updates(params, want_u)
    for g in (grads, wide):
        u, s = opt.update(g, state, params)
        new_p, s2 = ff.optim.update_and_apply(opt, g, state, params)
        for a, b in zip(ff.tree.leaves((u, s.inner)), ff.tree.leaves((want_u, want_s))):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(ff.tree.leaves((new_p, s2.inner)), ff.tree.leaves((want_p, want_s))):
            np.testing.assert_array_equal(a, b)
        for st in (s, s2):
            for c, a in zip(ff.tree.leaves(st.compute_params), ff.tree.leaves(want_p)):
                np.testing.assert_array_equal(c.view(np.uint16),
                                              a.astype(BF16).view(np.uint16))


def test_compute_copy_rejects_bad_arguments():
    model, params, _, _ = _model(9)
    with pytest.raises(TypeError, match="compute_copy: expected an optimizer"):
        mp.compute_copy("adam")
    with pytest.raises(ValueError, match=r"16-bit float.*compute_copy\(opt, 'bfloat16'\)"):
        mp.compute_copy(ff.optim.adam(1e-3), "float32")
    with pytest.raises(ValueError, match="compute dtype must be one of"):
        mp.compute_copy(ff.optim.adam(1e-3), "int8")
    opt = mp.compute_copy(ff.optim.sgd(0.1))
    state = opt.init(params)
    grads = ff.tree.map(lambda p: p.astype(BF16), params)
    with pytest.raises(TypeError, match="needs the params"):
        opt.update(grads, state)
    with pytest.raises(TypeError, match="compute_copy.update"):
        opt.update(grads, ff.optim.sgd(0.1).init(params), params)
    with pytest.raises(ValueError, match="compute_copy.update.*structure"):
        opt.update(grads[:2], state, params)
    step = ff.train.make_step(model, ff.losses.softmax_cross_entropy,
                              mp.compute_copy(ff.optim.sgd(0.1), "float16"),
                              compute_dtype="bfloat16")
    x = np.ones((4, 32), np.float32)
    with pytest.raises(TypeError, match="compute copy in float16.*compute_copy"):
        step(params, mp.compute_copy(ff.optim.sgd(0.1), "float16").init(params), x,
             np.arange(4))


def test_checkpoint_keeps_a_bfloat16_compute_copy_bit_for_bit(tmp_path):
    """A state with a bfloat16 compute copy is saved as safetensors' BF16 and read back as
    bfloat16, the same bits, with ``like`` and without."""
    model, params, _, _ = _model(4)
    opt = mp.dynamic_loss_scaling(ff.optim.adam(1e-3), compute_dtype="bfloat16")
    state = opt.init(ff.tree.map(lambda p: p * np.float32(1.0 + 2 ** -10), params))
    path = tmp_path / "state.safetensors"
    ff.checkpoint.save(path, {"opt": state})
    for back in (ff.checkpoint.load(path, like={"opt": state}), ff.checkpoint.load(path)):
        for a, b in zip(ff.tree.leaves(back["opt"].compute_params),
                        ff.tree.leaves(state.compute_params)):
            assert a.dtype == BF16
            np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))


def test_cli_trains_mnist_in_bfloat16(cli, mnist_dir, tmp_path):
    """One epoch of the default MLP on real MNIST with --precision bfloat16 (CPU here)."""
    out = tmp_path / "run"
    r = cli("train", "--data-dir", str(mnist_dir), "--precision", "bfloat16", "--epochs", "1",
            "--out", str(out), "--no-progress", "--backend", "numpy")
    assert r.returncode == 0, r.stderr
    acc = float(r.stdout.strip().splitlines()[-1].split("=")[1])
    assert acc > 0.95, r.stdout


# ---- the GPU against the reference -----------------------------------------------------------
def _cuda():
    cupy = pytest.importorskip("cupy")
    pytest.importorskip("nvmath")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA GPU visible")
    except Exception:  # noqa: BLE001 - CuPy without a driver
        pytest.skip("no CUDA GPU visible")
    from fuseflow.backend import cuda_backend

    if not cuda_backend._BFLOAT16:
        pytest.skip("bfloat16 needs CuPy 14")
    return cupy


def to_bfloat16_once(x):
    """``x.astype(bfloat16)`` rounded once to nearest even, whatever ml_dtypes does: its
    releases before the double-rounding fix (jax-ml/ml_dtypes#401) narrow float64 to
    float32 first; the device machine's 0.6.0 does (call 133), 0.7.0 rounds once. Normal
    float64 values round their significand to bfloat16's 8 bits on the integer bits (the
    result is exact in float32, so the two casts after it do not round); other values
    (zeros, subnormals, infinities, NaN) take ml_dtypes' path."""
    x = np.asarray(x)
    if x.dtype != np.float64:
        return x.astype(BF16)
    normal = np.isfinite(x) & (np.abs(x) >= np.finfo(np.float32).tiny)
    bits = x.view(np.uint64).copy()
    drop = np.uint64(64 - 1 - 11 - 7)  # float64 keeps 52 fraction bits, bfloat16 7
    half = (np.uint64(1) << (drop - np.uint64(1))) - np.uint64(1)
    odd = (bits >> drop) & np.uint64(1)
    bits[normal] = ((bits[normal] + half + odd[normal]) >> drop) << drop
    with np.errstate(over="ignore"):  # beyond bfloat16's range: infinity, as it should
        out = x.astype(BF16)
        out[normal] = bits[normal].view(np.float64).astype(np.float32).astype(BF16)
    return out


def test_the_once_rounded_reference_breaks_float32_ties():
    """The reference above against values whose nearest bfloat16 the arithmetic fixes:
    1 + 2**-8 + 2**-30 rounds up (through float32 it would be a tie, rounded down to 1);
    exact ties go to the even neighbour; large values overflow to infinity."""
    x = np.array([1 + 2 ** -8 + 2 ** -30, -(1 + 2 ** -8 + 2 ** -30), 1 + 2 ** -8,
                  1 + 3 * 2 ** -8, 1 + 2 ** -8 - 2 ** -40, 3.4e38, 0.0, 1e-40])
    want = np.array([1 + 2 ** -7, -(1 + 2 ** -7), 1.0, 1 + 2 ** -6, 1.0, np.inf, 0.0],
                    np.float32)
    got = to_bfloat16_once(x)
    np.testing.assert_array_equal(got[:7].astype(np.float32), want)
    assert got[7] == np.float32(1e-40).astype(BF16)


@pytest.mark.gpu
def test_gpu_casts_round_as_numpy_does(rng):
    """multi_tensor_cast and the compiled step's batch copy: float32/float64 to bfloat16
    rounds to nearest even, bit for bit NumPy's (ml_dtypes) astype (float64 once, not
    through float32: ``to_bfloat16_once``), and back exactly, subnormals included; float16
    and bfloat16 cast to each other through float32; a compiled step casts a float16 batch
    to bfloat16 (not in its copy, which has no such cast, but at the step's start)."""
    cupy = _cuda()
    from fuseflow.backend import _cuda_fused as F
    from fuseflow.backend import _cuda_graph_inputs as GI

    # the last rounds up from float64 directly, down through float32
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1 + 2 ** -8, 1 + 3 * 2 ** -9,
                        3.0e38, 1e-40, 1 + 2 ** -8 + 2 ** -30], np.float64)
    for src_dtype in (np.float32, np.float64):
        host = np.concatenate([special, rng.standard_normal(10_007) * 300]).astype(src_dtype)
        (got,) = F.multi_tensor_cast([cupy.asarray(host)], BF16)
        same_bits_or_both_nan(cupy.asnumpy(got), to_bfloat16_once(host))
        dst = cupy.empty(host.shape, BF16)
        GI.copy_arrays([(dst, cupy.asarray(host))])
        same_bits_or_both_nan(cupy.asnumpy(dst), to_bfloat16_once(host))
        for wide in (np.float32, np.float64):  # back, exactly, by either path
            (back,) = F.multi_tensor_cast([got], wide)
            np.testing.assert_array_equal(cupy.asnumpy(back), cupy.asnumpy(got).astype(wide))
            copied = cupy.empty(host.shape, wide)
            GI.copy_arrays([(copied, got)])
            np.testing.assert_array_equal(cupy.asnumpy(copied),
                                          cupy.asnumpy(got).astype(wide))
    # float32 subnormals widen exactly and float64 ones narrow to them (CuPy's -ftz=true
    # flushes a plain conversion either way), in the vector loops and their scalar tails
    tiny = np.tile(np.array([1e-40, -3e-42, 1.4e-45, -0.0, 1.2e-38, -1e-39], np.float32), 4)[:23]
    for src, dst in ((tiny, np.float64), (tiny.astype(np.float64), np.float32)):
        (cast,) = F.multi_tensor_cast([cupy.asarray(src)], dst)
        copied = cupy.empty(src.shape, dst)
        GI.copy_arrays([(copied, cupy.asarray(src))])
        bits = np.uint64 if dst == np.float64 else np.uint32
        for got in (cast, copied):
            np.testing.assert_array_equal(cupy.asnumpy(got).view(bits), src.astype(dst).view(bits))
    x16 = (rng.standard_normal(4099) * 100).astype(np.float16)
    (bf,) = F.multi_tensor_cast([cupy.asarray(x16)], BF16)
    same_bits_or_both_nan(cupy.asnumpy(bf), x16.astype(np.float32).astype(BF16))
    (h,) = F.multi_tensor_cast([bf], np.float16)
    np.testing.assert_array_equal(cupy.asnumpy(h),
                                  cupy.asnumpy(bf).astype(np.float32).astype(np.float16))
    with pytest.raises(ValueError, match="16-bit"):
        GI.conversion(cupy.empty(3, np.float16), cupy.empty(3, BF16))
    assert not GI.casts(np.float16, BF16) and GI.casts(np.float32, BF16)
    step = ff.compile(lambda p, x: (p, x * 2), donate_argnums=(0,), cast_args={1: "bfloat16"})
    for _ in range(2):  # the capture's call, then a replay
        _, y = step(cupy.zeros(3, np.float32), cupy.asarray(x16))
        assert y.dtype == BF16
        np.testing.assert_array_equal(cupy.asnumpy(y).view(np.uint16),
                                      (x16.astype(np.float32).astype(BF16) * 2).view(np.uint16))


@pytest.mark.gpu
@pytest.mark.parametrize("scaled", [True, False, "copy"],
                         ids=["loss_scaled", "unscaled", "compute_copy"])
def test_gpu_training_in_bfloat16_matches_the_numpy_reference(rng, scaled):
    """Eager steps of a 3-layer MLP (ReLU and GELU epilogs, the skinny output layer) in
    bfloat16 mixed precision, with dynamic loss scaling and its compute copy, with a
    plain optimizer, or with compute_copy: the GPU's losses follow the NumPy backend's
    over 30 steps, and a compiled step gives the eager step's losses."""
    cupy = _cuda()
    model, params, x, y = _model(3)
    x = rng.standard_normal((256, 32)).astype(np.float32)
    y = rng.integers(0, 10, 256)

    def run(params, x, y, compiled=False, steps=30):
        opt = ff.optim.adam(1e-3)
        if scaled == "copy":
            opt = mp.compute_copy(opt, "bfloat16")
        elif scaled:
            opt = mp.dynamic_loss_scaling(opt, compute_dtype="bfloat16")
        state = opt.init(params)
        step = ff.train.make_step(model, ff.losses.softmax_cross_entropy, opt,
                                  compute_dtype="bfloat16")
        if compiled:
            step = ff.compile(step)
        out = []
        for _ in range(steps):
            params, state, m = step(params, state, x, y)
            out.append(float(m["loss"]))
        return np.array(out)

    ref = run(params, x, y)
    gpu_params = ff.device_put(params, "cuda")
    eager = run(gpu_params, cupy.asarray(x), cupy.asarray(y))
    np.testing.assert_allclose(eager, ref, rtol=3e-2)
    assert eager[-1] < eager[0]
    compiled = run(ff.device_put(params, "cuda"), cupy.asarray(x), cupy.asarray(y), True)
    np.testing.assert_allclose(compiled, eager, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_gpu_compute_copy_is_the_unscaled_step_bit_for_bit(rng, opt_name, compiled):
    """On the GPU, compute_copy's step (bfloat16 gradients read by the fused update, the
    copy written by it) gives the plain optimizer's unscaled bfloat16 step (float32
    gradients, the params cast each step) bit for bit over 20 steps: losses, params,
    moments; the copy is the params cast; the update kernel took the 16-bit gradients."""
    cupy = _cuda()
    model = nn.Serial(nn.Dense(256, "relu"), nn.Dense(128, "gelu"), nn.Dense(10))
    _, params = model.init(ff.random.key(11), (64,))
    params = ff.device_put(params, "cuda")
    x = cupy.asarray(rng.standard_normal((128, 64)).astype(np.float32))
    y = cupy.asarray(rng.integers(0, 10, 128))
    inner = ff.optim.sgd(0.1) if opt_name == "sgd" else ff.optim.adam(1e-3)
    be = ff.backend.get("cuda")

    def run(opt):
        step = ff.train.make_step(model, ff.losses.softmax_cross_entropy, opt,
                                  compute_dtype="bfloat16")
        step = ff.compile(step) if compiled else step
        p, s = ff.tree.map(lambda a: a.copy(), params), opt.init(params)
        losses = []
        for _ in range(20):
            p, s, m = step(p, s, x, y)
            losses.append(float(m["loss"]))
        return losses, p, s

    be.reset_stats()
    losses, p, s = run(mp.compute_copy(inner, "bfloat16"))
    assert be.stats()["calls"].get(f"multi_tensor_update/{opt_name}/16bit", 0) >= 1
    be.reset_stats()
    ref_losses, p_ref, s_ref = run(inner)
    assert be.stats()["calls"].get(f"multi_tensor_update/{opt_name}", 0) >= 1
    assert losses == ref_losses and losses[-1] < losses[0]
    for a, b in zip(ff.tree.leaves((p, s.inner)), ff.tree.leaves((p_ref, s_ref))):
        np.testing.assert_array_equal(cupy.asnumpy(a), cupy.asnumpy(b))
    for c, a in zip(ff.tree.leaves(s.compute_params), ff.tree.leaves(p)):
        assert c.dtype == BF16
        np.testing.assert_array_equal(cupy.asnumpy(c).view(np.uint16),
                                      cupy.asnumpy(a).astype(BF16).view(np.uint16))


@pytest.mark.gpu
def test_gpu_plain_update_of_bfloat16_grads_keeps_the_reference_promotions(rng):
    """update_and_apply of a plain optimizer on bfloat16 gradients of float32 params is not
    compute_copy's: the fused kernel (which reads them as float32) is not taken, and the
    result is the reference's (opt.update, then apply_updates), bit for bit."""
    cupy = _cuda()
    be = ff.backend.get("cuda")
    params = {"w": cupy.asarray(rng.standard_normal((64, 32)).astype(np.float32))}
    grads = {"w": cupy.asarray(normal(rng, (64, 32)))}
    opt = ff.optim.sgd(0.1)
    be.reset_stats()
    new, _ = ff.optim.update_and_apply(opt, grads, opt.init(params), params)
    assert not any(k.startswith("multi_tensor_update/") for k in be.stats()["calls"])
    updates, _ = opt.update(grads, opt.init(params), params)
    want = ff.optim.apply_updates(params, updates)
    np.testing.assert_array_equal(cupy.asnumpy(new["w"]), cupy.asnumpy(want["w"]))


@pytest.mark.gpu
@pytest.mark.parametrize("loss_scaling", ["dynamic", "none"])
def test_gpu_cli_trains_mnist_in_bfloat16(cli, mnist_dir, tmp_path, loss_scaling):
    _cuda()
    out = tmp_path / "run"
    r = cli("train", "--data-dir", str(mnist_dir), "--precision", "bfloat16", "--out",
            str(out), "--no-progress", "--backend", "cuda", "--loss-scaling", loss_scaling)
    assert r.returncode == 0, r.stderr
    shown = "no loss scaling" if loss_scaling == "none" else "dynamic loss scaling"
    assert f"; bfloat16 ({shown});" in r.stdout
    acc = float(r.stdout.strip().splitlines()[-1].split("=")[1])
    assert acc > 0.97, r.stdout
