"""``ff.random.bits`` (Philox4x32-10, counter-based), Dropout's factors from it, and Dropout
in compiled steps: Random123's known answers, the same bits on every backend, and a new
mask each call of a compiled step (GPU tests are marked and skip without a GPU)."""

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn
from fuseflow.backend.base import BackendError
from fuseflow.nn import LayerError
from tests.test_compile import _cuda, gpu


# Random123's published known-answer vectors for Philox4x32-10 (its tests/kat_vectors)
KAT = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
       ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
       ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_philox_known_answers(ctr, key, want):
    out = ff.random.philox4x32([[c] for c in ctr], key)
    assert out.dtype == np.uint32 and tuple(int(v) for v in out[:, 0]) == want


def test_bits_layout_is_block_words_in_c_order():
    """Element i is word i % 4 of the block at counter (i // 4, 0, 0, 0); shapes only
    reshape that sequence, so a shorter draw is a prefix of a longer one."""
    k = ff.random.key(7)
    b = ff.random.bits(k, 11)
    blocks = ff.random.philox4x32([[0, 1, 2], [0, 0, 0], [0, 0, 0], [0, 0, 0]], k)
    np.testing.assert_array_equal(b, blocks.T.reshape(-1)[:11])
    np.testing.assert_array_equal(ff.random.bits(k, (3, 5, 2)).reshape(-1),
                                  ff.random.bits(k, 30))
    np.testing.assert_array_equal(ff.random.bits(k, 30)[:11], b)
    assert ff.random.bits(k, (0, 4)).shape == (0, 4)


def test_bits_depend_on_the_key_and_look_uniform():
    a, b = ff.random.bits(ff.random.key(1), 1 << 16), ff.random.bits(ff.random.key(2), 1 << 16)
    assert a.dtype == np.uint32 and (a != b).mean() > 0.99
    np.testing.assert_array_equal(a, ff.random.bits(ff.random.key(1), 1 << 16))
    u = a / 2.0 ** 32
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    counts = np.bincount((a >> 28).astype(np.int64), minlength=16)  # the top 4 bits
    chi2 = ((counts - len(a) / 16) ** 2 / (len(a) / 16)).sum()
    assert chi2 < 45  # 15 degrees of freedom: p < 2e-4 above 45
    ones = np.unpackbits(a.view(np.uint8)).mean()
    assert abs(ones - 0.5) < 0.005


def test_streams_and_layer_keys():
    """Another stream word gives other bits; a model's layer keys are the key's KEY_STREAM
    bits, apart from the bits the key draws itself."""
    k = ff.random.key(4)
    a, b = ff.random.bits(k, 4096), ff.random.bits(k, 4096, stream=1)
    assert (a != b).mean() > 0.99
    keys = ff.backend.get("numpy").layer_keys(k, 3)
    assert keys.shape == (3, 2) and keys.dtype == np.uint32
    np.testing.assert_array_equal(keys, ff.random.bits(k, (3, 2), ff.random.KEY_STREAM))
    assert len({tuple(r) for r in keys.tolist()}) == 3


def test_bits_refuse_a_bad_key():
    with pytest.raises(TypeError, match="expected a key"):
        ff.random.bits(np.zeros(3, np.uint32), 4)
    # None: a custom random layer that does not declare draws_random gets no key
    with pytest.raises(TypeError, match="the key is None.*declares draws_random = True"):
        ff.random.bits(None, 4)
    be = ff.backend.get("numpy")  # the route the custom-layer guide gives layers
    for draw in (lambda: be.random_bits(None, (4,)),
                 lambda: be.dropout(None, np.ones(4, np.float32), 0.5)):
        with pytest.raises(TypeError, match="the key is None"):
            draw()


def test_keep_threshold_and_the_edges_of_dropout_scale():
    """Rate 0 keeps every element (the bound is 2**32, above every uint32); a rate whose
    factor overflows the dtype is refused rather than turned into inf or nan; the stream
    word must be a uint32."""
    assert ff.random.keep_threshold(0.25) == 3 * 2 ** 30
    assert ff.random.keep_threshold(0.0) == 2 ** 32
    assert ff.random.keep_threshold(0.5) == 2 ** 31
    be = ff.backend.get("numpy")
    np.testing.assert_array_equal(be.dropout_scale(ff.random.key(0), 1 << 16, np.float32, 0.0),
                                  np.ones(1 << 16, np.float32))
    with pytest.raises(BackendError, match="not finite in float16"):
        be.dropout_scale(ff.random.key(0), 8, np.float16, 0.99999)
    for bad in (-1, 2 ** 32):
        with pytest.raises(ValueError, match="stream must be in"):
            be.random_bits(ff.random.key(0), 8, stream=bad)
    with pytest.raises(TypeError, match="stream must be an int"):
        ff.random.bits(ff.random.key(0), 8, stream=1.5)


def test_serial_derives_layer_keys_only_for_layers_that_take_them():
    """A Serial of Dense layers draws no layer keys (no host or GPU work per step); one with
    another layer does, and a bad key names the Serial."""
    be = ff.backend.get("numpy")
    x = np.ones((4, 6), np.float32)
    for model, draws in ((nn.Serial(nn.Dense(5, "relu"), nn.Dense(3)), 0),
                         (nn.Serial(nn.Dense(5, "relu"), nn.Dropout(0.5), nn.Dense(3)), 1)):
        _, params = model.init(ff.random.key(0), (6,))
        be.reset_stats()
        model.forward(params, x, key=ff.random.key(1))
        assert be.calls["random_bits"] == draws
    with pytest.raises(LayerError, match=r"Serial\(.*\): the key: .*expected a key"):
        model.forward(params, x, key=np.zeros(2, np.int32))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_dropout_scale_on_numpy(dtype, rate):
    be = ff.backend.get("numpy")
    k = ff.random.key(3)
    s = be.dropout_scale(k, (200, 500), dtype, rate)
    assert s.dtype == dtype and s.shape == (200, 500)
    keep = ff.random.bits(k, (200, 500)) < np.uint32(ff.random.keep_threshold(rate))
    np.testing.assert_array_equal(s, np.where(keep, np.dtype(dtype).type(1 / (1 - rate)), 0))
    assert abs((s != 0).mean() - (1 - rate)) < 0.01
    with pytest.raises(BackendError, match="rate must be in"):
        be.dropout_scale(k, 4, dtype, 1.0)


def test_dropout_uses_the_bits_and_names_itself_on_a_bad_key():
    x = np.random.default_rng(0).standard_normal((16, 40)).astype(np.float32)
    k = ff.random.key(9)
    y, res = nn.Dropout(0.3).forward({}, x, key=k)
    scale = ff.backend.get("numpy").dropout_scale(k, x.shape, x.dtype, 0.3)
    np.testing.assert_array_equal(res["scale"], scale)
    np.testing.assert_array_equal(y, x * scale)
    with pytest.raises(LayerError, match=r"Dropout\(0.3\): .*expected a key"):
        nn.Dropout(0.3).forward({}, x, key=np.zeros(2, np.int64))


def test_serial_draws_random_when_a_layer_does():
    assert nn.Serial(nn.Dense(4, "relu"), nn.Dropout(0.2), nn.Dense(2)).draws_random
    assert not nn.Serial(nn.Dense(4, "relu"), nn.Dense(2)).draws_random
    assert nn.Dropout(0.1).draws_random and not nn.Dense(3).draws_random


def _fit_runs(device, compiled_flags, epochs=2):
    """fit on a small problem with Dropout, once per flag, from the same state."""
    model = nn.Serial(nn.Dense(32, "relu"), nn.Dropout(0.25), nn.Dense(10))
    opt = ff.optim.adam(1e-3)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 20)).astype(np.float32)
    y = rng.integers(0, 10, 512)
    out = []
    for compiled in compiled_flags:
        state = ff.train.init_state(model, opt, (20,), ff.random.key(0))
        state = state._replace(params=ff.device_put(state.params, device),
                               opt_state=ff.device_put(state.opt_state, device))
        res = ff.train.fit(model, opt, state, (x, y), epochs=epochs, batch_size=64,
                           compiled=compiled, progress=False, log=None)
        out.append(res)
    return out


def test_fit_compiled_with_dropout_on_numpy_matches_eager():
    """fit's keyed compiled path (``_keyed``: the key a sixth positional argument) on NumPy,
    where compile is a pass-through: it trains exactly as eager."""
    eager, compiled = _fit_runs("cpu", (False, True))
    assert [r["train_loss"] for r in eager.history] == \
        [r["train_loss"] for r in compiled.history]


# ---- GPU ------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("shape", [(0,), (1,), (3,), (4,), (5, 7), (1023,), (3, 4, 5),
                                   ((1 << 20) + 3,)])
def test_gpu_bits_equal_the_hosts(shape):
    cp = _cuda()
    be = ff.backend.get("cuda")
    for seed in (0, 12345, 2 ** 64 - 1):
        k = ff.random.key(seed)
        want = ff.random.bits(k, shape)
        for key in (k, cp.asarray(k)):
            got = be.random_bits(key, shape)
            assert isinstance(got, cp.ndarray) and got.dtype == np.uint32
            np.testing.assert_array_equal(cp.asnumpy(got), want)


@gpu
def test_gpu_bits_streams_grid_loop_and_torch_keys(monkeypatch):
    """Another stream word, a grid capped at 3 blocks (the grid-stride loop runs many
    passes) and a key given through DLPack: the host's bits. A GPU key handed to the host
    generator says what to use instead."""
    cp = _cuda()
    from fuseflow.backend import _cuda_random

    be = ff.backend.get("cuda")
    k = ff.random.key(77)
    np.testing.assert_array_equal(cp.asnumpy(be.random_bits(cp.asarray(k), 999, stream=5)),
                                  ff.random.bits(k, 999, stream=5))
    monkeypatch.setattr(_cuda_random, "MAX_BLOCKS", 3)
    np.testing.assert_array_equal(cp.asnumpy(be.random_bits(cp.asarray(k), (37, 1001))),
                                  ff.random.bits(k, (37, 1001)))
    np.testing.assert_array_equal(
        cp.asnumpy(be.dropout_scale(cp.asarray(k), 50_001, np.float16, 0.3)),
        ff.backend.get("numpy").dropout_scale(k, 50_001, np.float16, 0.3))
    monkeypatch.undo()
    try:  # a torch GPU tensor as the key (DLPack), where torch can hold uint32 on the GPU
        import torch

        tk = torch.from_numpy(k.copy()).cuda()
    except Exception:  # noqa: BLE001 - no torch, no CUDA torch, or no uint32 there
        tk = None
    if tk is not None:
        np.testing.assert_array_equal(cp.asnumpy(be.random_bits(tk, 64)), ff.random.bits(k, 64))
    with pytest.raises(TypeError, match="random_bits"):
        ff.random.bits(cp.asarray(k), 4)


@gpu
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("rate", [0.0, 1e-9, 0.1, 0.5, 0.9, 0.999])
def test_gpu_dropout_scale_equals_the_hosts(dtype, rate):
    cp = _cuda()
    k = ff.random.key(42)
    want = ff.backend.get("numpy").dropout_scale(k, (333, 129), dtype, rate)
    got = ff.backend.get("cuda").dropout_scale(cp.asarray(k), (333, 129), dtype, rate)
    assert got.dtype == dtype
    np.testing.assert_array_equal(cp.asnumpy(got), want)


@gpu
def test_gpu_layer_keys_and_serial_dropout_equal_the_hosts():
    """A Serial with Dropout on the GPU: its layer keys derived on the device from a device
    key, or on the host from a host key, give the CPU model's output (float64: the matmuls
    round differently in the last bits; another mask would differ by order 1)."""
    cp = _cuda()
    k = ff.random.key(8)
    np.testing.assert_array_equal(
        cp.asnumpy(ff.backend.get("cuda").layer_keys(cp.asarray(k), 5)),
        ff.backend.get("numpy").layer_keys(k, 5))
    model = nn.Serial(nn.Dense(64, "relu"), nn.Dropout(0.5), nn.Dense(32, "relu"),
                      nn.Dropout(0.2), nn.Dense(10))
    _, params = model.init(ff.random.key(0), (20,))
    params = ff.tree.map(lambda a: a.astype(np.float64), params)
    x = np.random.default_rng(3).standard_normal((16, 20))
    want, _ = model.forward(params, x, key=k)
    pg, xg = ff.device_put((params, x), "cuda")
    for key in (k, cp.asarray(k)):
        got, _ = model.forward(pg, xg, key=key)
        np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-9, atol=1e-12)


@gpu
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_gpu_dropout_forward_backward_equal_the_hosts(dtype):
    """The one-pass forward kernel (output and factor), a strided input (the two-step
    fallback) and the backward: the host's values, signed zeros, infinities and NaNs
    included (NaN payloads differ between CPUs and GPUs)."""
    cp = _cuda()
    rng = np.random.default_rng(1)
    x, dy = (rng.standard_normal((64, 300)).astype(dtype) for _ in range(2))
    x[0, :4] = [np.inf, -np.inf, -0.0, np.nan]
    k = ff.random.key(5)
    layer = nn.Dropout(0.4)
    with np.errstate(invalid="ignore"):  # inf * 0 on the host: nan, as on the GPU
        y, res = layer.forward({}, x, key=k)
    _, dx = layer.backward({}, res, dy)
    yg, resg = layer.forward({}, cp.asarray(x), key=cp.asarray(k))
    _, dxg = layer.backward({}, resg, cp.asarray(dy))
    for got, want in ((yg, y), (resg["scale"], res["scale"]), (dxg, dx)):
        got = cp.asnumpy(got)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)  # NaN where the host has NaN (any payload)
        real = ~np.isnan(want)
        np.testing.assert_array_equal(np.signbit(got[real]), np.signbit(want[real]))
    xt = cp.asarray(np.ascontiguousarray(x.T)).T  # not C-contiguous
    yt, st = ff.backend.get("cuda").dropout(cp.asarray(k), xt, 0.4)
    np.testing.assert_array_equal(cp.asnumpy(yt), y)
    np.testing.assert_array_equal(cp.asnumpy(st), res["scale"])


def _dropout_step():
    model = nn.Serial(nn.Dense(256, "relu"), nn.Dropout(0.3), nn.Dense(128, "relu"),
                      nn.Dropout(0.1), nn.Dense(10))
    _, params = model.init(ff.random.key(2), (784,))
    opt = ff.optim.adam(1e-3)
    grad_fn = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)

    def step(params, opt_state, x, y, key):
        loss, grads = grad_fn(params, x, y, key=key)
        params, opt_state = ff.optim.update_and_apply(opt, grads, opt_state, params)
        return params, opt_state, {"loss": loss}
    return params, opt.init(params), step


@gpu
def test_compiled_step_with_dropout_draws_each_calls_mask():
    """A compiled step with Dropout, its key a GPU argument: every call (a new key each,
    copied in by the graph) gives the eager step's loss and params."""
    cp = _cuda()
    params, state, step = _dropout_step()
    rng = np.random.default_rng(2)
    xs = cp.asarray(rng.random((6, 128, 784), dtype=np.float32))
    ys = cp.asarray(rng.integers(0, 10, (6, 128)))
    pe, se = ff.device_put((params, state), "cuda")
    pc, sc = ff.tree.map(lambda a: a.copy(), (pe, se))
    compiled = ff.compile(step)
    losses = []
    for i in range(6):
        k = ff.device_put(ff.random.fold_in(ff.random.key(11), i), "cuda")
        pe, se, me = step(pe, se, xs[i], ys[i], k)
        pc, sc, mc = compiled(pc, sc, xs[i], ys[i], k)
        np.testing.assert_allclose(float(mc["loss"]), float(me["loss"]), rtol=1e-5)
        losses.append(float(mc["loss"]))
    assert compiled.compiles == 1
    for a, b in zip(ff.tree.leaves(pc), ff.tree.leaves(pe)):
        np.testing.assert_allclose(cp.asnumpy(a), cp.asnumpy(b), rtol=1e-5, atol=1e-7)
    # the same batch under two keys: two masks, two losses
    k1, k2 = (ff.device_put(ff.random.key(s), "cuda") for s in (1, 2))
    p1 = ff.tree.map(lambda a: a.copy(), (pc, sc))
    l1 = float(compiled(*p1, xs[0], ys[0], k1)[2]["loss"])
    p2 = ff.tree.map(lambda a: a.copy(), (pc, sc))
    l2 = float(compiled(*p2, xs[0], ys[0], k2)[2]["loss"])
    assert l1 != l2


@gpu
def test_compiled_step_with_a_host_key_says_how_to_fix_it():
    cp = _cuda()
    params, state, step = _dropout_step()
    p, s = ff.device_put((params, state), "cuda")
    x = cp.asarray(np.random.default_rng(0).random((32, 784), dtype=np.float32))
    y = cp.arange(32) % 10
    with pytest.raises(Exception, match="inside a compiled step .*ff.device_put"):
        ff.compile(step)(p, s, x, y, ff.random.key(0))


@gpu
def test_fit_compiled_with_dropout_on_the_gpu_matches_eager():
    _cuda()
    eager, compiled = _fit_runs("cuda", (False, True))
    np.testing.assert_allclose([r["train_loss"] for r in compiled.history],
                               [r["train_loss"] for r in eager.history], rtol=1e-5)
