"""The 16-bit output layer's tensor-core forward with its softmax cross-entropy in one kernel
(``_cuda_skinny_tc.forward_xent``, the backend call ``linear_xent``): logits and loss
gradient bit for bit those of the forward kernel and the loss kernel, the loss added in
another order; in a training step, the same gradients and params. GPU only (marked)."""

import ml_dtypes
import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn

pytestmark = pytest.mark.gpu


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _operands(cp, n, batch=2070, k=2048, label_dtype=np.int64, bias=True, seed=0,
              dtype=np.float16):
    """16-bit x (batch, k), w (n, k), bias (n,), labels: batch x k x 10 above 2**25 (where
    the backend's forward leaves the SIMT kernel for the tensor-core one), batch not a
    multiple of the kernel's 16 rows."""
    rng = np.random.default_rng(seed)
    x = cp.asarray(rng.standard_normal((batch, k)).astype(dtype))
    w = cp.asarray((rng.standard_normal((n, k)) / np.sqrt(k)).astype(dtype))
    b = cp.asarray(rng.standard_normal(n).astype(dtype)) if bias else None
    labels = cp.asarray(rng.integers(0, n, batch).astype(label_dtype))
    return x, w, b, labels


@pytest.mark.parametrize("n", [1, 10, 16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("label_dtype", [np.int64, np.int32, np.uint8])
@pytest.mark.parametrize("scale", [None, 1024.0, 2.0 ** 30])  # the last overflows float16
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16],
                         ids=lambda d: np.dtype(d).name)
def test_forward_xent_is_the_forward_and_the_loss_kernel(cp, n, bias, label_dtype, scale,
                                                         dtype):
    from fuseflow.backend import _cuda_fused as F
    from fuseflow.backend import _cuda_skinny_tc as TC
    from fuseflow.backend.cuda_backend import _BFLOAT16

    if dtype != np.float16 and not _BFLOAT16:
        pytest.skip("bfloat16 needs CuPy 14")
    x, w, b, labels = _operands(cp, n, label_dtype=label_dtype, bias=bias, dtype=dtype)
    gs = None if scale is None else cp.asarray(np.float32(scale))
    assert TC.forward_supported(x, w, b, None) and TC.xent_supported(x, labels)
    loss, y, dy = TC.forward_xent(x, w, b, labels, gs)
    y_ref, _ = TC.forward(x, w, b)
    loss_ref, dy_ref = F.softmax_xent(y_ref, labels, gs, None if gs is None else dtype)
    assert y.dtype == dy.dtype == dtype and loss.dtype == cp.float32
    np.testing.assert_array_equal(_bits(cp.asnumpy(y)), _bits(cp.asnumpy(y_ref)))
    np.testing.assert_array_equal(_bits(cp.asnumpy(dy)), _bits(cp.asnumpy(dy_ref)))
    np.testing.assert_allclose(float(loss), float(loss_ref), rtol=2e-6)
    # the overflow the loss scaler must see (one class: every gradient is 0; bfloat16's
    # range holds it)
    if scale == 2.0 ** 30 and n > 1 and dtype == np.float16:
        assert not bool(cp.isfinite(dy).all())


def test_linear_xent_takes_the_kernel_only_where_the_forward_is_tensor_core(cp, monkeypatch):
    """The backend call runs the fused kernel where ``linear`` would run the tensor-core
    forward, with labels the kernel reads and the loss gradient in float16; elsewhere, or
    with ``fused_tc_xent`` off, None (the caller runs the two calls)."""
    be = ff.backend.get("cuda")
    x, w, b, labels = _operands(cp, 10)
    gs = cp.asarray(np.float32(256))
    be.reset_stats()
    out = be.linear_xent(x, w, b, labels, gs, cp.float16)
    assert out is not None and be.stats()["fused_tc_xent"] == 1
    assert be.linear_xent(x, w, b, labels) is not None  # no scale: dy in the logits' dtype
    assert be.linear_xent(x, w, b, labels, gs) is None  # a float32 gradient: not this kernel
    assert be.linear_xent(x.astype(cp.float32), w.astype(cp.float32), None, labels) is None
    stats = be.stats()
    for args in [(x[:64], w, b, labels[:64]),  # short: no tensor-core forward
                 (x, w[:3], b[:3], labels % 3),  # tensor-core capable, but linear's SIMT one
                 (x[:, ::2], w[:, ::2], b, labels),  # not contiguous
                 (x, w, b, labels.astype(cp.float32)),  # not class indices
                 (x, w, b, labels[:-1])]:  # a label short: the unfused path names it
        assert be.linear_xent(*args) is None
    assert be.stats() == stats  # nothing copied or counted on the way to None
    monkeypatch.setattr(be, "fused_tc_xent", False)
    assert be.linear_xent(x, w, b, labels, gs, cp.float16) is None


@pytest.mark.parametrize("compiled", [False, True])
def test_float16_step_with_the_fused_forward_and_loss_gives_the_same_params(cp, monkeypatch,
                                                                            compiled):
    """A mixed-precision make_step whose output layer takes the tensor-core forward (hidden
    2048 at batch 2048): with ``fused_tc_xent`` on and off, eager and compiled, the params
    after 8 steps are the same bits (the loss gradient is), the losses agree to their
    summation order, and the fused kernel ran (``stats``)."""
    be = ff.backend.get("cuda")
    model = nn.Serial(nn.Dense(2048, "relu"), nn.Dense(10))
    _, params = model.init(ff.random.key(3), (256,))
    rng = np.random.default_rng(3)
    xs = cp.asarray(rng.standard_normal((4, 2048, 256)).astype(np.float32))
    ys = cp.asarray(rng.integers(0, 10, (4, 2048)))
    runs = {}
    for fused in (True, False):
        monkeypatch.setattr(be, "fused_tc_xent", fused)
        be.reset_stats()
        opt = ff.mixed_precision.dynamic_loss_scaling(ff.optim.adam(1e-3),
                                                      compute_dtype="float16")
        step = ff.train.make_step(model, ff.losses.softmax_cross_entropy, opt,
                                  compute_dtype="float16")
        step = ff.compile(step) if compiled else step
        p, s = ff.device_put((params, opt.init(params)), "cuda")
        losses = []
        for i in range(8):
            p, s, m = step(p, s, xs[i % 4], ys[i % 4])
            losses.append(float(m["loss"]))
        runs[fused] = (losses, ff.tree.map(cp.asnumpy, p))
        assert (be.stats()["fused_tc_xent"] > 0) == fused
    np.testing.assert_allclose(runs[True][0], runs[False][0], rtol=1e-5)
    for a, b in zip(ff.tree.leaves(runs[True][1]), ff.tree.leaves(runs[False][1])):
        np.testing.assert_array_equal(a, b)
    assert runs[True][0][-1] < runs[True][0][0]
