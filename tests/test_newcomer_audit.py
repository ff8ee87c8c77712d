"""A newcomer's review (the fifty-fifth session): what a user following the docs hit, each
checked here against the fix.

- a model object of the user's own (the contract's init/forward/backward, no ``apply``)
  trains and evaluates with ``fit``/``evaluate``, as it does with ``value_and_grad``;
- a custom layer whose init/forward/backward does not return the contract's pair is named,
  with the pair it must return, instead of a bare unpacking error (or, for a forward
  returning only y of batch 2, silently unpacking its rows);
- ``fit(out_dir=...)`` finds an unusable folder before the first step, not at the first save;
- ``check_grads(train=False)`` on a model with Dropout and no key names the inference
  residuals, and ``max_checks < 1`` is refused;
- IDX files in another layout than MNIST's are named as such, not as swapped files;
- ``comm.shard``'s fix names batch sizes that divide; the ``ff.random`` samplers of real
  numbers refuse integer dtypes; ``randint`` names an empty range; ``ff.data.batches``
  names a list; the loss curve of a loss below zero is drawn on a linear axis.
"""

import re
import warnings

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn
from fuseflow.data import DatasetError
from fuseflow.data._idx import read_split
from fuseflow.nn import LayerError
from fuseflow.train._records import plot_curves
from tests.test_data import idx_bytes


def raises(exc, *parts):
    """``pytest.raises`` whose message holds ``parts`` in this order (each taken literally)."""
    return pytest.raises(exc, match=".*".join(map(re.escape, parts)))


class OwnModel:
    """A container of the user's own: only the contract's three methods (no ``nn.Layer``)."""

    def __init__(self):
        self.body = nn.Serial(nn.Dense(16, "relu"), nn.Dense(10))

    def init(self, key, in_shape):
        return self.body.init(key, in_shape)

    def forward(self, params, x, *, key=None, train=True):
        return self.body.forward(params, x, key=key, train=train)

    def backward(self, params, residuals, dy):
        return self.body.backward(params, residuals, dy)


# ---- 1. fit and evaluate take a model without apply --------------------------------------
def test_fit_and_evaluate_take_a_model_of_ones_own_without_apply():
    train, test = ff.data.digits("train"), ff.data.digits("test")
    own, opt = OwnModel(), ff.optim.adam(1e-3)
    state = ff.train.init_state(own, opt, (64,), ff.random.key(0))
    assert not hasattr(own, "apply")
    got = ff.train.evaluate(own, state.params, *test)
    want = ff.train.evaluate(own.body, state.params, *test)  # a Serial: through its apply
    assert got == want and 0 <= got.accuracy <= 1
    result = ff.train.fit(own, opt, state, train, test, epochs=1, batch_size=128, log=None,
                          progress=False)
    trained = ff.train.fit(own.body, opt, state, train, test, epochs=1, batch_size=128,
                           log=None, progress=False)
    assert result.history[-1]["test_acc"] == trained.history[-1]["test_acc"]
    assert result.history[-1]["test_acc"] > got.accuracy  # it learned


# ---- 2. the contract's pairs --------------------------------------------------------------
class Scale(nn.Layer):
    """y = x * s; ``returns`` picks which method breaks the contract and how."""

    def __init__(self, returns=None):
        self.returns = returns

    def __repr__(self):
        return f"Scale({self.returns!r})"

    def init(self, key, in_shape):
        params = {"s": np.ones(in_shape, np.float32)}
        if self.returns == "init: params only":
            return params
        if self.returns == "init: swapped":
            return params, tuple(in_shape)
        return tuple(in_shape), params

    def forward(self, params, x, *, key=None, train=True):
        y = x * params["s"]
        return y if self.returns == "forward: y only" else (y, {"x": x})

    def backward(self, params, residuals, dy):
        dx = dy * params["s"]
        if self.returns == "backward: dx only":
            return dx
        if self.returns == "backward: three":
            return {"s": (dy * residuals["x"]).sum(0)}, dx, None
        return {"s": (dy * residuals["x"]).sum(0)}, dx


def _serial(returns):
    return nn.Serial(nn.Dense(3), Scale(returns), nn.Dense(2))


def test_a_correct_custom_layer_passes_everything_the_checks_guard():
    layer, model = Scale(), _serial(None)
    _, p = layer.init(ff.random.key(0), (3,))
    x = np.random.default_rng(0).standard_normal((4, 3))
    assert ff.check_grads(layer, p, x).max_error <= 1.0
    _, mp = model.init(ff.random.key(1), (5,))
    loss, _ = ff.value_and_grad(model, ff.losses.softmax_cross_entropy)(
        mp, np.ones((2, 5), np.float32), np.array([0, 1]))
    assert np.isfinite(float(loss))


@pytest.mark.parametrize("batch", [1, 2, 3])  # 2: unpacking would take the output's two rows
@pytest.mark.parametrize("returns,method,pair,got", [
    ("forward: y only", "forward", "(y, residuals)", "one ndarray"),
    ("backward: dx only", "backward", "(grads, dx)", "one ndarray"),
    ("backward: three", "backward", "(grads, dx)", "a tuple of 3"),
])
def test_forward_or_backward_not_returning_the_pair_is_named(batch, returns, method, pair, got):
    model = _serial(returns)
    _, p = model.init(ff.random.key(0), (5,))
    x = np.random.default_rng(batch).standard_normal((batch, 5)).astype(np.float32)
    y = np.arange(batch) % 2
    with raises(LayerError, f"Serial layer 1 (Scale({returns!r})): {method} must return the "
                f"pair {pair}, got {got}. Fix: return both"):
        ff.value_and_grad(model, ff.losses.softmax_cross_entropy)(p, x, y)
    layer = Scale(returns)
    _, lp = Scale().init(ff.random.key(0), (3,))
    with raises(LayerError, f"Scale({returns!r}): {method} must return the pair {pair}"):
        ff.check_grads(layer, lp, x[:, :3].astype(np.float64))
    # a model of the user's own, not a Serial, is named too
    with raises(LayerError, f"Scale({returns!r}): {method} must return the pair {pair}"):
        ff.value_and_grad(layer, lambda out, t: ff.losses.mse(out, t))(lp, x[:, :3],
                                                                        x[:, :3])


@pytest.mark.parametrize("returns,message", [
    ("init: params only", "init must return the pair (out_shape, params), got one dict"),
    ("init: swapped", "init must return (out_shape, params), out_shape first; got dict"),
])
def test_init_not_returning_out_shape_then_params_is_named(returns, message):
    """The swapped pair had blamed the next layer: "Dense(2): in_shape must be (features,),
    got 's'. Fix: flatten the input"."""
    with raises(LayerError, f"Serial layer 1 (Scale({returns!r})): {message}"):
        _serial(returns).init(ff.random.key(0), (5,))
    with raises(LayerError, f"Scale({returns!r}): {message}"):
        ff.train.init_state(Scale(returns), ff.optim.sgd(0.1), (3,), ff.random.key(0))


# ---- 3. fit checks out_dir before training --------------------------------------------------
def test_fit_refuses_an_out_dir_under_a_file_before_the_first_step(tmp_path):
    (tmp_path / "afile").write_text("not a folder")
    model, opt = ff.train.mlp(hidden=(8,), classes=10), ff.optim.sgd(0.1)
    state = ff.train.init_state(model, opt, (64,), ff.random.key(0))
    steps = []
    with raises(OSError, f"fit: out_dir {tmp_path / 'afile' / 'sub'}: {tmp_path / 'afile'} is a "
                "file, so no folder can be made inside it. Fix: out_dir=a path"):
        ff.train.fit(model, opt, state, ff.data.digits("train"), epochs=1, batch_size=128,
                     out_dir=tmp_path / "afile" / "sub", log=None, progress=False,
                     on_step=lambda s, m: steps.append(1))
    assert steps == []  # no epoch's work is lost to it
    out = tmp_path / "new" / "run"  # a missing folder is made, as documented
    ff.train.fit(model, opt, state, ff.data.digits("train"), epochs=1, batch_size=512,
                 out_dir=out, log=None, progress=False)
    assert (out / "metrics.jsonl").is_file()


# ---- 4. check_grads ---------------------------------------------------------------------------
def test_check_grads_train_false_with_dropout_and_no_key_names_the_inference_residuals():
    model = nn.Serial(nn.Dense(8, "relu"), nn.Dropout(0.3), nn.Dense(3))
    _, p = model.init(ff.random.key(0), (5,))
    x = ff.random.normal(ff.random.key(1), (4, 5))
    for key in (ff.random.key(3), None):  # without a key it had said "pass train=False"
        with raises(ff.GradientCheckError, "backward failed on the residuals of "
                    "forward(..., train=False)", "Fix: check_grads(..., train=True)"):
            ff.check_grads(model, p, x, key=key, train=False)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_check_grads_refuses_a_max_checks_that_checks_nothing(bad):
    layer = nn.Dense(4)
    _, p = layer.init(ff.random.key(0), (3,))
    with raises(ValueError, "check_grads: max_checks must be a whole number >= 1", f"got {bad!r}"):
        ff.check_grads(layer, p, ff.random.normal(ff.random.key(1), (4, 3)), max_checks=bad)
    assert ff.check_grads(layer, p, ff.random.normal(ff.random.key(1), (4, 3)),
                          max_checks=1).max_error <= 1.0


# ---- 5. IDX data sets of one's own -------------------------------------------------------
@pytest.mark.parametrize("images", [np.full((6, 4, 4), 0.5, np.float32),   # float images
                                    np.zeros((6, 20), np.uint8)])         # 2-D vectors
def test_idx_files_in_another_layout_are_named_as_such_not_as_swapped(tmp_path, images):
    (tmp_path / "i").write_bytes(idx_bytes(images))
    (tmp_path / "l").write_bytes(idx_bytes(np.arange(6, dtype=np.uint8)))
    with pytest.raises(DatasetError, match="should hold images") as err:
        read_split(tmp_path / "i", tmp_path / "l")
    assert "MNIST's layout, images uint8 (count, rows, cols)" in str(err.value)
    assert "swapped" not in str(err.value)
    (tmp_path / "i").write_bytes(idx_bytes(np.arange(6, dtype=np.uint8)))  # truly swapped
    (tmp_path / "l").write_bytes(idx_bytes(np.zeros((6, 4, 4), np.uint8)))
    with pytest.raises(DatasetError, match="should hold images.*not swapped"):
        read_split(tmp_path / "i", tmp_path / "l")


# ---- 6-9. messages ----------------------------------------------------------------------------
def test_shard_of_a_full_batch_names_sizes_that_divide():
    comm = ff.distributed.Communicator(None)
    comm.size = 3  # shard's arithmetic alone, as test_distributed_audit does
    with raises(ff.distributed.DistributedError, "a global batch of 64 cannot be split evenly "
                "over 3 ranks. Fix: a batch size that is a multiple of 3, e.g. 63 or 66; if 64 "
                "is only the smaller last batch of an epoch, drop_last=True"):
        comm.shard(np.ones(64))
    with raises(ff.distributed.DistributedError, "e.g. 3; if 2 is only"):
        comm.shard(np.ones(2))


@pytest.mark.parametrize("sampler", ["normal", "uniform", "truncated_normal"])
@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint8, bool, "int64"])
def test_samplers_of_real_numbers_refuse_integer_dtypes(sampler, dtype):
    """An int32 normal had been mostly 0 and -1, silently."""
    with raises(TypeError, f"ff.random.{sampler}: dtype must be a floating dtype",
                f"got {np.dtype(dtype).name}", "ff.random.randint"):
        getattr(ff.random, sampler)(ff.random.key(0), (6,), dtype=dtype)
    out = getattr(ff.random, sampler)(ff.random.key(0), (6,), dtype=np.float16)
    assert out.dtype == np.float16 and len(np.unique(out)) > 1


@pytest.mark.parametrize("low,high", [(5, 5), (5, 2), (0, np.array([3, 0]))])
def test_randint_names_an_empty_range(low, high):
    with raises(ValueError, "ff.random.randint: low must be below high (high is excluded)"):
        ff.random.randint(ff.random.key(0), (2,), low, high)
    assert set(ff.random.randint(ff.random.key(0), (200,), 4, 6)) == {4, 5}


@pytest.mark.parametrize("which", ["x", "y"])
def test_batches_names_a_list_at_the_call(which):
    x, y = np.ones((4, 2), np.float32), np.arange(4)
    args = {"x": (x.tolist(), y), "y": (x, y.tolist())}[which]
    with raises(TypeError, f"ff.data.batches: {which} must be a NumPy or CuPy array, got a "
                f"list. Fix: {which} = np.asarray({which})"):
        ff.data.batches(*args, 2, shuffle=False)  # at the call, not at the first next()


@pytest.mark.parametrize("losses,scale", [([2.3, 0.4], "log"), ([-1.5, -2.0], "linear"),
                                          ([0.5, -0.1], "linear")])
def test_loss_curve_is_log_only_for_positive_losses(tmp_path, losses, scale, monkeypatch):
    import matplotlib.axes
    scales = []
    real = matplotlib.axes.Axes.set_yscale
    monkeypatch.setattr(matplotlib.axes.Axes, "set_yscale",
                        lambda ax, v, **kw: (scales.append(v), real(ax, v, **kw))[1])
    records = [{"epoch": i + 1, "train_loss": v, "test_loss": v + 0.1, "train_acc": None,
                "test_acc": None} for i, v in enumerate(losses)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib had warned: no positive values
        plot_curves(records, tmp_path / "curves.png")
    assert scales == (["log"] if scale == "log" else [])
    assert (tmp_path / "curves.png").stat().st_size > 0
