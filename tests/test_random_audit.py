"""Audit of ``ff.random``: seeds and counts at their edges, derived keys that must not
collide, the bits against an independent Philox4x32-10, statistics of every draw (fixed
seeds, thresholds at p = 1e-6, so they cannot flake), permutations of every length, and the
keys ``fit`` derives per epoch, step and rank (Dropout's masks)."""

import itertools
import math

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn

R = ff.random
MASK = 0xFFFFFFFF
# chi-square bounds exceeded with probability 1e-6 (scipy.stats.chi2.isf(1e-6, df))
CHI2_1E6 = {15: 56.5, 23: 70.6, 99: 180.8, 255: 377.1}
KS_1E6 = 2.70  # sqrt(n) * D above this: p < 1e-6 (Kolmogorov, 2 exp(-2 x^2))


def chi2(counts):
    counts = np.asarray(counts, np.float64)
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())


def ks_sqrt_n_d(sample, cdf):
    """sqrt(n) times the Kolmogorov-Smirnov distance of ``sample`` from ``cdf``."""
    x = np.sort(np.asarray(sample, np.float64))
    f, n = cdf(x), len(x)
    d = max((np.arange(1, n + 1) / n - f).max(), (f - np.arange(n) / n).max())
    return math.sqrt(n) * d


_erf = np.frompyfunc(math.erf, 1, 1)


def normal_cdf(x):
    return 0.5 * (1 + _erf(x / math.sqrt(2)).astype(np.float64))


# ---- keys from seeds ------------------------------------------------------------------------
@pytest.mark.parametrize("seed,words", [
    (0, (0, 0)), (1, (0, 1)), (2 ** 32 - 1, (0, MASK)), (2 ** 32, (1, 0)),
    (2 ** 63, (2 ** 31, 0)), (2 ** 64 - 1, (MASK, MASK)), (-1, (MASK, MASK)),
    (-2 ** 63, (2 ** 31, 0)), (np.int32(-1), (MASK, MASK)), (np.uint64(2 ** 64 - 1), (MASK, MASK)),
    (np.uint8(7), (0, 7)), (np.array(5), (0, 5))])
def test_key_words_are_the_seeds_64_bits(seed, words):
    """key(seed) is [seed >> 32, seed & 0xFFFFFFFF], negative seeds as two's complement."""
    k = R.key(seed)
    assert k.dtype == np.uint32 and k.shape == (2,) and tuple(int(w) for w in k) == words


@pytest.mark.parametrize("seed,error", [
    (True, TypeError), (np.bool_(False), TypeError), (1.0, TypeError), (np.float64(2), TypeError),
    (np.array([5]), TypeError), (np.array(5.0), TypeError), ("5", TypeError), (None, TypeError),
    (2 ** 64, ValueError), (-2 ** 63 - 1, ValueError)])
def test_key_refuses_what_is_no_64_bit_int(seed, error):
    with pytest.raises(error, match="ff.random.key: seed"):
        R.key(seed)


def test_split_and_fold_in_counts_and_data_at_the_edges():
    k = R.key(5)
    for num in (0, 1, 2, np.int8(3), np.array(4)):
        s = R.split(k, num)
        assert s.dtype == np.uint32 and s.shape == (int(num), 2)
    np.testing.assert_array_equal(R.split(k, 3)[:2], R.split(k, 2))  # a prefix, as documented
    for bad, error in ((-1, ValueError), (True, TypeError), (2.0, TypeError)):
        with pytest.raises(error, match="ff.random.split: num"):
            R.split(k, bad)
    for data in (0, 1, 2 ** 32, 2 ** 64 - 1, np.uint32(5), np.array(3)):
        f = R.fold_in(k, data)
        assert f.dtype == np.uint32 and f.shape == (2,)
    np.testing.assert_array_equal(R.fold_in(k, -1), R.fold_in(k, 2 ** 64 - 1))
    np.testing.assert_array_equal(R.fold_in(k, np.int64(7)), R.fold_in(k, 7))
    for bad, error in ((2 ** 64, ValueError), (True, TypeError), (1.0, TypeError),
                       (np.array([1, 2]), TypeError)):
        with pytest.raises(error, match="ff.random.fold_in: data"):
            R.fold_in(k, bad)


def test_draws_name_the_function_given_a_bad_key():
    bad = np.zeros(2, np.int64)
    for name, draw in (("normal", lambda: R.normal(bad, 3)),
                       ("uniform", lambda: R.uniform(bad, 3)),
                       ("bernoulli", lambda: R.bernoulli(bad, 0.5, 3)),
                       ("permutation", lambda: R.permutation(bad, 3)),
                       ("randint", lambda: R.randint(bad, 3, 0, 5)),
                       ("truncated_normal", lambda: R.truncated_normal(bad, 3)),
                       ("split", lambda: R.split(bad)), ("fold_in", lambda: R.fold_in(bad, 1)),
                       ("bits", lambda: R.bits(bad, 3))):
        with pytest.raises(TypeError, match=rf"ff\.random\.{name}: expected a key"):
            draw()


# ---- independence of derived keys -----------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2 ** 64 - 1])
def test_derived_keys_never_collide(seed):
    """The key, its split children, fold_in of edge data, two-level fold_ins (both orders) and
    a model's layer keys: all distinct. fold_in(k, 0) is not k, split(k)[0] is not k, the high
    word of the data matters, and fold_in does not commute."""
    k = R.key(seed)
    data = [*range(32), 2 ** 32, 2 ** 32 + 1, 2 ** 63, 2 ** 64 - 1]
    keys = [k, *R.split(k, 64), *(R.fold_in(k, d) for d in data),
            *(R.fold_in(R.fold_in(k, a), b) for a, b in itertools.permutations(range(6), 2)),
            *ff.backend.get("numpy").layer_keys(k, 16)]
    as_tuples = [tuple(int(w) for w in key) for key in keys]
    assert len(set(as_tuples)) == len(as_tuples)
    assert not np.array_equal(R.fold_in(k, 1), R.fold_in(k, 1 + 2 ** 32))


def test_epoch_orders_differ_between_seeds_and_epochs():
    """init_state's data key per seed, epoch e's order permutation(fold_in(data_key, e), n)
    (docs/cli.md): no two (seed, epoch) pairs give one order, and neighbouring seeds' orders
    are not shifted copies (the rank correlation of two orders is near 0)."""
    n, orders = 200, {}
    for seed in range(4):
        data_key = R.split(R.key(seed), 3)[2]  # init_state: init, layers, data
        for epoch in range(4):
            orders[seed, epoch] = R.permutation(R.fold_in(data_key, epoch), n)
    assert len({o.tobytes() for o in orders.values()}) == len(orders)
    for a, b in itertools.combinations(orders.values(), 2):
        assert abs(np.corrcoef(a, b)[0, 1]) < 0.35  # independent: sd 0.07, 5 sd


# ---- bits: an independent Philox4x32-10 ------------------------------------------------------
def philox_reference(counter, key):
    """Philox4x32-10 from Salmon et al. (2011), in Python ints, written from the paper."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & MASK, (k1 + 0xBB67AE85) & MASK
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK, (p0 >> 32) ^ c3 ^ k1, p0 & MASK
    return c0, c1, c2, c3


@pytest.mark.parametrize("seed", [0, 1, 2 ** 32 - 1, 2 ** 63, 2 ** 64 - 1])
@pytest.mark.parametrize("stream", [0, 1, R.KEY_STREAM, 2 ** 32 - 1])
def test_bits_equal_an_independent_philox(seed, stream):
    """Element i is word i % 4 of the block at counter (i // 4, 0, stream, 0) in the
    documented layout (block index in words 0-1, stream in word 2); the high counter word is
    checked through philox4x32 (2**32 blocks would not fit in memory)."""
    k = R.key(seed)
    words = [int(w) for w in k]
    want = [w for b in range(4) for w in philox_reference((b, 0, stream, 0), words)][:13]
    np.testing.assert_array_equal(R.bits(k, 13, stream), np.array(want, np.uint32))
    np.testing.assert_array_equal(R.bits(k, 13, np.uint32(stream)), R.bits(k, (13,), stream))
    ctr = (5, 2 ** 32 - 1, stream, MASK)
    got = R.philox4x32([[c] for c in ctr], k)[:, 0]
    assert tuple(int(w) for w in got) == philox_reference(ctr, words)


@pytest.mark.parametrize("shape", [-1, (-1, 4), (2, -2), (3, -1)])
def test_bits_refuse_a_negative_shape(shape):
    """Before: an empty array (the GPU backend's cupy.empty refuses such a shape)."""
    with pytest.raises(ValueError, match="ff.random.bits: shape .* negative"):
        R.bits(R.key(0), shape)
    with pytest.raises(ValueError, match="negative"):
        ff.backend.get("numpy").random_bits(R.key(0), shape)


@pytest.mark.parametrize("shape", [2.0, (2.0,), None, (2, "3"), True])
def test_bits_refuse_a_shape_of_non_ints(shape):
    with pytest.raises(TypeError, match="ff.random.bits: shape must be an int"):
        R.bits(R.key(0), shape)


def test_bits_take_shapes_as_numpy_does():
    k = R.key(3)
    flat = R.bits(k, 24)
    for shape in ((2, 3, 4), [2, 3, 4], np.array([2, 3, 4]), (np.int64(2), np.uint8(3), 4)):
        np.testing.assert_array_equal(R.bits(k, shape), flat.reshape(2, 3, 4))
    np.testing.assert_array_equal(R.bits(k, np.array(24)), flat)
    assert R.bits(k, ()).shape == () and int(R.bits(k, ())) == flat[0]
    assert R.bits(k, (0, 5)).shape == (0, 5) and R.bits(k, 0).shape == (0,)


@pytest.mark.parametrize("seed", [0, 7, 2 ** 64 - 1])
def test_bits_statistics(seed):
    """Each byte of each word position, and pairs of consecutive top nibbles, uniform."""
    b = R.bits(R.key(seed), 1 << 18)
    for j in range(4):
        for shift in (0, 8, 16, 24):
            byte = ((b[j::4] >> shift) & 255).astype(np.int64)
            assert chi2(np.bincount(byte, minlength=256)) < CHI2_1E6[255]
    top = (b >> 28).astype(np.int64)
    assert chi2(np.bincount(top[:-1] * 16 + top[1:], minlength=256)) < CHI2_1E6[255]


def test_first_bits_across_neighbouring_seeds_streams_and_layer_keys_are_uniform():
    """Counter-based: neighbouring keys and streams must not give related first words."""
    n = 1 << 13
    seeds = np.array([R.bits(R.key(s), 1)[0] for s in range(n)])
    streams = R.philox4x32([np.zeros(n), np.zeros(n), np.arange(n), np.zeros(n)], R.key(1))[0]
    folded = np.array([R.bits(R.fold_in(R.key(2), i), 1)[0] for i in range(n)])
    for words in (seeds, streams, folded):
        assert chi2(np.bincount((words >> 24).astype(np.int64), minlength=256)) < CHI2_1E6[255]
        assert chi2(np.bincount((words & 255).astype(np.int64), minlength=256)) < CHI2_1E6[255]


# ---- uniform, normal, truncated_normal, bernoulli, randint ------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2 ** 63])
def test_float_draws_follow_their_distributions(seed):
    k, n = R.key(seed), 50_000
    assert ks_sqrt_n_d(R.uniform(k, n), lambda x: x) < KS_1E6
    assert ks_sqrt_n_d(R.uniform(k, n, -3.0, 5.0, np.float64), lambda x: (x + 3) / 8) < KS_1E6
    assert ks_sqrt_n_d(R.normal(k, n), normal_cdf) < KS_1E6
    lo, hi = -2.0, 1.0
    tn = R.truncated_normal(k, n, lo, hi, np.float64)
    assert tn.min() >= lo and tn.max() <= hi
    mass = normal_cdf(np.array([lo, hi]))
    assert ks_sqrt_n_d(tn, lambda x: (normal_cdf(x) - mass[0]) / (mass[1] - mass[0])) < KS_1E6
    p = 0.3
    hits = int(R.bernoulli(k, p, n).sum())
    assert abs(hits - p * n) < 5 * math.sqrt(n * p * (1 - p))
    assert chi2(np.bincount(R.randint(k, n, -5, 95) + 5, minlength=100)) < CHI2_1E6[99]
    assert R.randint(k, n, -5, 95).min() == -5 and R.randint(k, n, -5, 95).max() == 94


def test_truncated_normal_refuses_an_interval_far_in_a_tail():
    with pytest.raises(ValueError, match="must hold at least 0.001"):
        R.truncated_normal(R.key(0), 4, 3.5, 10.0)
    assert R.truncated_normal(R.key(0), 4, 3.0, np.inf).min() >= 3.0  # 0.00135: accepted


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("lo,hi", [(0.0, 1.0), (-1.0, 1.0), (-3.0, 5.0)])
def test_uniform_stays_below_maxval(dtype, lo, hi):
    """[minval, maxval), as jax.random.uniform. Before, float16 rounded about 1 draw in 4,000
    of [0, 1) up to 1.0; every draw below maxval keeps its value (NumPy's draw, rounded)."""
    for seed in (0, 1):
        k = R.key(seed)
        got = R.uniform(k, 1 << 18, lo, hi, dtype)
        want = R.generator(k).uniform(lo, hi, 1 << 18).astype(dtype)
        assert got.dtype == dtype and got.shape == want.shape
        assert float(got.max()) < hi and float(got.min()) >= lo
        kept = want.astype(np.float64) < hi
        np.testing.assert_array_equal(got[kept], want[kept])
        np.testing.assert_array_equal(got[~kept], np.nextafter(want[~kept], dtype(-np.inf)))


@pytest.mark.parametrize("dtype,hi", [(np.float16, 0.1), (np.float16, 0.9), (np.float32, 0.7)])
def test_uniform_stays_below_maxval_as_the_dtype_rounds_it(dtype, hi):
    """float16(0.1) is 0.09998 < 0.1, and ``x < 0.1`` on a float16 array compares with it
    (NumPy 2's Python scalars take the array's dtype): no draw may equal it either."""
    got = R.uniform(R.key(1), 1 << 18 if dtype == np.float16 else 1 << 25, 0.0, hi, dtype)
    assert (got < hi).all() and (got < dtype(hi)).all() and float(got.max()) < hi


# ---- permutation ------------------------------------------------------------------------------
def test_permutation_is_a_permutation_of_every_length():
    k = R.key(11)
    for n in [*range(34), 1000, np.int64(17), np.uint8(5), np.array(9)]:
        p = R.permutation(R.fold_in(k, int(n)), n)
        assert p.shape == (int(n),) and p.dtype.kind == "i"
        np.testing.assert_array_equal(np.sort(p), np.arange(int(n)))
    rows = np.arange(12).reshape(6, 2)
    shuffled = R.permutation(k, rows)  # an array: its rows in the order permutation(k, 6)
    np.testing.assert_array_equal(shuffled, rows[R.permutation(k, 6)])


@pytest.mark.parametrize("n,error", [(-1, ValueError), (-5, ValueError), (True, TypeError),
                                     (2.0, TypeError), (np.float32(3), TypeError)])
def test_permutation_refuses_what_is_no_length(n, error):
    """Before: -1 gave an empty array, True a permutation of 1, floats an AxisError."""
    with pytest.raises(error, match="ff.random.permutation: n must be an int"):
        R.permutation(R.key(0), n)


def test_permutations_are_uniform_and_positions_unbiased():
    perms = {p: i for i, p in enumerate(itertools.permutations(range(4)))}
    counts = np.zeros(24)
    for i in range(6000):
        counts[perms[tuple(R.permutation(R.fold_in(R.key(1), i), 4).tolist())]] += 1
    assert chi2(counts) < CHI2_1E6[23]
    where = np.zeros((16, 16))  # element e lands at position p
    for s in range(2000):
        where[np.arange(16), R.permutation(R.key(s), 16)] += 1
    assert chi2(where.ravel()) < CHI2_1E6[255]


# ---- what fit derives: the data order per epoch, the layers' key per step (and rank) ---------
class Probe(nn.Layer):
    """Identity that records the key and the batch it gets (a layer that draws randomness)."""
    draws_random = True

    def __init__(self):
        self.seen = []

    def init(self, key, in_shape):
        return in_shape, {}

    def forward(self, params, x, *, key=None, train=True):
        if train:
            self.seen.append((np.array(key), np.array(x[:, 0])))
        return x, {}

    def backward(self, params, residuals, dy):
        return {}, dy


def test_fit_uses_the_documented_order_and_step_keys():
    """docs/cli.md: epoch e visits the data in permutation(fold_in(data_key, e), n) and the
    layers' key at step s is fold_in(key, s) (Serial hands its layer i layer_keys' row i)."""
    probe = Probe()
    model = nn.Serial(probe, nn.Dense(3))
    n, bs = 20, 5
    x = np.zeros((n, 4), np.float32)
    x[:, 0] = np.arange(n)
    y = np.arange(n) % 3
    state = ff.train.init_state(model, ff.optim.sgd(0.0), (4,), R.key(123))
    ff.train.fit(model, ff.optim.sgd(0.0), state, (x, y), epochs=2, batch_size=bs,
                 progress=False, log=None)
    assert len(probe.seen) == 2 * n // bs
    be = ff.backend.get("numpy")
    for s, (key, rows) in enumerate(probe.seen):
        epoch, b = divmod(s, n // bs)
        order = R.permutation(R.fold_in(state.data_key, epoch), n)
        np.testing.assert_array_equal(rows, order[b * bs:(b + 1) * bs])
        np.testing.assert_array_equal(key, be.layer_keys(R.fold_in(state.key, s), 2)[0])
    assert len({k.tobytes() for k, _ in probe.seen}) == len(probe.seen)


def test_dropout_masks_keep_their_fraction_and_are_independent_across_steps_and_ranks():
    """Each (step, rank) key as fit derives it (fold_in(fold_in(key, s), r), and without
    ranks fold_in(key, s)) gives a Serial's Dropout a mask that keeps 1 - rate of the inputs
    and agrees with every other mask only as independent ones do (p**2 + q**2)."""
    rate, shape = 0.3, (64, 512)
    model = nn.Serial(nn.Dropout(rate))
    _, params = model.init(R.key(0), shape[1:])
    x = np.ones(shape, np.float32)
    base = R.split(R.key(9), 3)[1]  # init_state's layer key
    keys = [R.fold_in(base, s) for s in range(4)]
    keys += [R.fold_in(R.fold_in(base, s), r) for s in range(4) for r in range(4)]
    masks = [model.forward(params, x, key=k)[0] != 0 for k in keys]
    n, keep = x.size, 1 - rate
    for m in masks:
        assert abs(m.mean() - keep) < 6 * math.sqrt(keep * rate / n)
    agree = keep ** 2 + rate ** 2
    for a, b in itertools.combinations(masks, 2):
        assert abs((a == b).mean() - agree) < 6 * math.sqrt(agree * (1 - agree) / n)


def test_keep_threshold_and_factor_take_a_float32_rate_as_its_value():
    """The documented floor((1 - rate) * 2**32) and 1 / (1 - rate) rounded once: before, a
    NumPy float32 rate was computed in float32 (threshold off by 96, factor by 5e-8)."""
    rate = np.float32(0.1)
    exact = 1.0 - float(rate)
    assert R.keep_threshold(rate) == math.floor(exact * 2 ** 32) == R.keep_threshold(float(rate))
    assert R.keep_factor(rate, np.float64) == np.float64(1.0 / exact)
    assert R.keep_factor(np.float16(0.5), np.float32) == np.float32(2.0)


@pytest.mark.parametrize("call", ["random_bits", "dropout_scale"])
def test_the_backends_refuse_a_negative_shape_as_ff_random_does(call):
    """Backend.random_bits and dropout_scale check the shape before either backend draws
    (CuPy's own error would name neither the call nor the fix)."""
    be = ff.backend.get("numpy")
    args = (R.key(3), (4, -2)) + ((np.dtype(np.float32), 0.5) if call == "dropout_scale" else ())
    with pytest.raises(ValueError, match=rf"{call}: shape \(4, -2\) has a negative size"):
        getattr(be, call)(*args)
