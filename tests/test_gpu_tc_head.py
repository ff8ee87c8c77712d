"""The 16-bit output layer's logits, loss and both gradients in one cluster launch
(``_cuda_tc_head.forward_grads``, the backend call ``linear_xent_grads``).

On operands whose products and float32 sums are exact (small integers times powers of two)
the logits are bit for bit NumPy's, and the loss gradient then bit for bit the xent
kernel's; the weight and input gradients and the input's column sums are then bit for bit
``_cuda_skinny_tc.grads`` on that loss gradient with the same rows per chunk (the same
k16 steps in the same order). On random floats every output is as close to a float64
NumPy reference as the two-kernel path's. In a training step: the same losses and params
as without it, eager and compiled. GPU only (marked); compute capability 9.0.
"""

import itertools

import ml_dtypes
import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn

pytestmark = pytest.mark.gpu

BF16 = ml_dtypes.bfloat16
HALVES = [np.float16, BF16]


# every test in each of the kernel's forms (_cuda_tc_head.FORMS): the whole cluster
# barrier, the barrier split in two (SPLIT_BARRIER), warp roles (ROLES, the default)
@pytest.fixture(scope="module", params=["whole", "split", "roles"])
def head(cp, request):
    from fuseflow.backend import _cuda_tc_head as HD

    if int(cp.cuda.Device().compute_capability) < 90:
        pytest.skip("thread-block clusters need compute capability 9.0")
    saved = HD.ROLES, HD.SPLIT_BARRIER
    HD.ROLES, HD.SPLIT_BARRIER = HD.FORMS[request.param]
    yield HD
    HD.ROLES, HD.SPLIT_BARRIER = saved


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _layer(cp, rng, batch, features, n, dtype, exact):
    """``(h, aux, w, b, labels)``: h = relu of 16-bit values (its relu_aux column-major, as
    the hidden layer's forward leaves it), w (n, features), b (n,). ``exact``: small
    integers, w and b scaled by 2^-6, so that every product and float32 sum is exact."""
    from fuseflow.backend.cuda_backend import CudaBackend

    if exact:
        pre = rng.integers(-2, 3, (batch, features)).astype(dtype)
        w = (rng.integers(-2, 3, (n, features)) / 64).astype(dtype)
        b = (rng.integers(-64, 65, n) / 64).astype(dtype)
    else:
        pre = rng.standard_normal((batch, features)).astype(dtype)
        w = (rng.standard_normal((n, features)) / np.sqrt(features)).astype(dtype)
        b = rng.standard_normal(n).astype(dtype)
    h, aux = CudaBackend(tf32=False).activation(cp.asarray(pre), "relu")
    labels = cp.asarray(rng.integers(0, n, batch))
    return h, cp.asfortranarray(aux), cp.asarray(w), cp.asarray(b), labels


def _rows_per_chunk(head, batch, n_clusters):
    tiles = -(-batch // head.TR)
    return -(-tiles // n_clusters) * head.TR


# (batch, features, classes, clusters): 8 / 2 / 4 / 1 blocks a cluster; batches that are
# not a multiple of the 32-row tile; one chunk (direct stores) and several (partials); each
# at least _cuda_skinny_tc.MIN_ELEMENTS batch x features, at most 512 rows a chunk
SHAPES = [(8192, 4096, 10, 16), (2100, 1024, 10, None), (2070, 2048, 3, 5),
          (1000, 4096, 16, 2), (4096, 512, 1, 8), (512, 4096, 10, 1)]


@pytest.mark.parametrize("dtype", HALVES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:3])))
def test_one_pass_is_the_forward_xent_and_grads_kernels(cp, rng, head, shape, dtype):
    _check_against_two_kernels(cp, rng, head, shape, dtype)


@pytest.mark.parametrize("tile", [(32, 4), (16, 3)], ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[2]], ids=lambda s: "x".join(map(str, s[:3])))
def test_other_tile_shapes_are_the_two_kernels(cp, rng, head, monkeypatch, shape, tile):
    """The tile shapes the sweep times (rows per tile x tiles in flight): four stages keep
    the mask bytes two tiles ahead of their use, 16-row tiles leave half the loss lanes
    idle."""
    monkeypatch.setattr(head, "TR", tile[0])
    monkeypatch.setattr(head, "STAGES", tile[1])
    _check_against_two_kernels(cp, rng, head, shape, BF16)


def _check_against_two_kernels(cp, rng, head, shape, dtype):
    from fuseflow.backend import _cuda_fused as F
    from fuseflow.backend import _cuda_skinny_tc as TC

    batch, features, n, clusters = shape
    clusters = clusters or head.CLUSTERS
    h, aux, w, b, labels = _layer(cp, rng, batch, features, n, dtype, exact=True)
    rows = _rows_per_chunk(head, batch, clusters)
    assert head.supported(h, w, labels) and rows <= TC.MAX_ROWS_PER_CHUNK
    f32 = np.float32
    hh, w32 = cp.asnumpy(h).astype(f32), cp.asnumpy(w).astype(f32)
    # (bias, mask, the input's bias gradient, loss scale): each flag of the kernel off once
    combos = [(True, True, True, None), (True, True, True, 1024.0), (False, False, False, None),
              (True, False, True, None), (False, True, False, 1024.0)]
    for bias, mask, bgrad_x, scale in combos:
        gs = None if scale is None else cp.asarray(np.float32(scale))
        bb = b if bias else None
        loss, y, dw, db, dx, dbx = head.forward_grads(
            h, w, bb, labels, gs, aux if mask else None, aux.shape[0] if mask else 0,
            bgrad_w=bias, bgrad_x=bgrad_x, n_clusters=clusters)
        case = f"bias={bias} mask={mask} bgrad_x={bgrad_x} scale={scale} (seed {rng.seed})"
        y_ref = (hh @ w32.T + (cp.asnumpy(b).astype(f32) if bias else 0)).astype(dtype)
        np.testing.assert_array_equal(_bits(cp.asnumpy(y)), _bits(y_ref), err_msg="y " + case)
        loss_ref, dy_ref = F.softmax_xent(cp.asarray(y_ref), labels, gs,
                                          None if gs is None else dtype)
        np.testing.assert_allclose(float(loss), float(loss_ref), rtol=2e-6, err_msg=case)
        gw, gb, gx, gbx = TC.grads(dy_ref, h, w, aux if mask else None,
                                   aux.shape[0] if mask else 0, bgrad_w=bias,
                                   bgrad_x=bgrad_x, rows=rows)
        for name, got, ref in (("dw", dw, gw), ("dx", dx, gx), ("dbx", dbx, gbx)):
            assert (got is None) == (ref is None), name
            if got is not None:
                assert got.dtype == dtype and got.shape == ref.shape
                np.testing.assert_array_equal(_bits(cp.asnumpy(got)), _bits(cp.asnumpy(ref)),
                                              err_msg=f"{name} {case}")
        assert (db is None) != bias
        if bias:  # the classes' sums of dy, added in another order
            db_ref = cp.asnumpy(dy_ref).astype(np.float64).sum(0)
            np.testing.assert_allclose(cp.asnumpy(db).astype(np.float64), db_ref,
                                       rtol=1e-2, atol=1e-3 * np.abs(db_ref).max() + 1e-30,
                                       err_msg=case)


def _float64_layer(h, aux_bits, w, b, labels, n):
    """loss, y, dw, db, dx, dbx of the layer in float64 (mask from the relu_aux bits)."""
    y = h @ w.T + b
    z = y - y.max(1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    rows = np.arange(len(labels))
    loss = -np.log(p[rows, labels]).mean()
    dy = p.copy()
    dy[rows, labels] -= 1
    dy /= len(labels)
    dx = (dy @ w) * aux_bits
    return loss, y, dy.T @ h, dy.sum(0), dx, dx.sum(0)


@pytest.mark.parametrize("dtype", HALVES, ids=lambda d: np.dtype(d).name)
def test_one_pass_is_as_close_to_float64_as_the_two_kernels(cp, rng, head, dtype):
    """Random floats: each output's largest error against a float64 reference of the same
    16-bit operands is within twice the two-kernel path's, plus half a 16-bit step."""
    from fuseflow.backend import _cuda_skinny_tc as TC
    from fuseflow.backend.numpy_backend import unpack_relu_aux

    batch, features, n = 4100, 2048, 10
    h, aux, w, b, labels = _layer(cp, rng, batch, features, n, dtype, exact=False)
    got = head.forward_grads(h, w, b, labels, None, aux, aux.shape[0], bgrad_w=True,
                             bgrad_x=True)
    loss2, y2, dy2 = TC.forward_xent(h, w, b, labels, None)
    two = (loss2, y2, *TC.grads(dy2, h, w, aux, aux.shape[0], bgrad_w=True, bgrad_x=True))
    f64 = np.float64
    bits = unpack_relu_aux(cp.asnumpy(aux), features).astype(f64)
    ref = _float64_layer(cp.asnumpy(h).astype(f64), bits, cp.asnumpy(w).astype(f64),
                         cp.asnumpy(b).astype(f64), cp.asnumpy(labels), n)
    names = ("loss", "y", "dw", "db", "dx", "dbx")
    for name, a, c, r in zip(names, got, two, ref):
        scale = max(np.abs(r).max(), 1e-30)
        err = np.abs(cp.asnumpy(a).astype(f64) - r).max() / scale
        err_two = np.abs(cp.asnumpy(c).astype(f64) - r).max() / scale
        # twice the two kernels' error, plus half a 16-bit step (a different rounding of
        # one value): a wrong fragment or sum is off by whole values
        slack = 2.0 ** -9 if dtype == BF16 else 2.0 ** -12
        assert err <= 2 * err_two + slack, \
            f"{name}: {err:.3g} vs {err_two:.3g} (seed {rng.seed})"
        assert err < (2e-2 if dtype == BF16 else 5e-3), f"{name}: {err:.3g} (seed {rng.seed})"


def test_linear_xent_grads_takes_the_kernel_only_where_switched_on(cp, head, monkeypatch):
    """The backend call: None with ``fused_tc_head`` off (the default) or where the
    operands are not the kernel's (short, too many classes, float32, not contiguous, an odd
    feature count), having counted nothing; with it on, the kernel, counted."""
    from fuseflow.backend.epilogs import relu_aux_rows

    be = ff.backend.get("cuda")
    rng = np.random.default_rng(5)
    h, aux, w, b, labels = _layer(cp, rng, 2070, 2048, 10, np.float16, exact=False)
    monkeypatch.setattr(be, "fused_tc_head", False)
    assert be.linear_xent_grads(h, w, b, labels, "DRELU_BGRAD", aux) is None
    monkeypatch.setattr(be, "fused_tc_head", True)
    be.reset_stats()
    out = be.linear_xent_grads(h, w, b, labels, "DRELU_BGRAD", aux)
    assert out is not None and be.stats()["fused_tc_head"] == 1
    loss, y, dw, db, dx, dbx = out
    assert dw.shape == (10, 2048) and db.shape == (10,) and dx.shape == h.shape
    stats = be.stats()
    w17 = cp.ascontiguousarray(cp.concatenate([w, w[:7]]))
    for args in [(h[:64], w, b, labels[:64], "DRELU_BGRAD", aux[:, :64]),  # short
                 (h, w17, None, labels, "DRELU_BGRAD", aux),  # 17 classes
                 (h.astype(cp.float32), w.astype(cp.float32), b.astype(cp.float32), labels,
                  "DRELU_BGRAD", aux),  # float32
                 (h[:, :1984], w[:, :1984], b, labels, "DRELU_BGRAD", aux)]:  # 1984 features
        args = list(args)
        if args[1].shape[1] == 1984:
            args[0], args[1] = cp.ascontiguousarray(args[0]), cp.ascontiguousarray(args[1])
            args[5] = cp.asfortranarray(aux[:relu_aux_rows(1984)])
        assert be.linear_xent_grads(*args) is None
    assert be.stats() == stats


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_step_with_the_one_pass_head_gives_the_same_training(cp, head, monkeypatch,
                                                              precision, opt_name):
    """A mixed-precision step whose output layer qualifies (hidden 2048, batch 2048): with
    ``fused_tc_head`` on, eager and compiled give the same losses to 1e-5, and they follow
    the run with it off to rounding (the logits and bias gradients add in another order);
    with SGD, whose update is linear in the gradients, so do the params, to a 16-bit step of
    a gradient times the learning rate per step (Adam's divides near-zero gradients by their
    own size: a last-bit change moves those by up to the learning rate). The kernel ran."""
    be = ff.backend.get("cuda")
    model = nn.Serial(nn.Dense(2048, "relu"), nn.Dense(10))
    _, params = model.init(ff.random.key(3), (256,))
    rng = np.random.default_rng(3)
    xs = cp.asarray(rng.standard_normal((4, 2048, 256)).astype(np.float32))
    ys = cp.asarray(rng.integers(0, 10, (4, 2048)))
    lr = {"sgd": 0.01, "adam": 1e-3}[opt_name]
    runs = {}
    for fused, compiled in itertools.product((True, False), (False, True)):
        monkeypatch.setattr(be, "fused_tc_head", fused)
        be.reset_stats()
        inner = getattr(ff.optim, opt_name)(lr)
        # float16 with its loss scale; bfloat16 unscaled with its compute copy (peers.py's)
        opt = ff.mixed_precision.dynamic_loss_scaling(inner, compute_dtype=precision) \
            if precision == "float16" else ff.mixed_precision.compute_copy(inner, precision)
        step = ff.train.make_step(model, ff.losses.softmax_cross_entropy, opt,
                                  compute_dtype=precision)
        step = ff.compile(step) if compiled else step
        p, s = ff.device_put((params, opt.init(params)), "cuda")
        losses = []
        for i in range(8):
            p, s, m = step(p, s, xs[i % 4], ys[i % 4])
            losses.append(float(m["loss"]))
        runs[fused, compiled] = (losses, ff.tree.map(cp.asnumpy, p))
        assert (be.stats()["fused_tc_head"] > 0) == fused, (fused, compiled)
    np.testing.assert_allclose(runs[True, True][0], runs[True, False][0], rtol=1e-5)
    np.testing.assert_allclose(runs[True, False][0], runs[False, False][0], rtol=1e-3)
    if opt_name == "sgd":  # a 16-bit bias gradient may round one step apart: lr x that
        for a, c in zip(ff.tree.leaves(runs[True, False][1]),
                        ff.tree.leaves(runs[False, False][1])):
            np.testing.assert_allclose(a, c, rtol=1e-3, atol=8 * lr * 2.0 ** -8)
    assert min(runs[True, True][0][4:]) < runs[True, True][0][0]  # it learns
