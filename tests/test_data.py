"""fuseflow.data: IDX parsing and its failure modes, MNIST look-up/download/cache, the
offline digits, and mini-batches (order, resumption, devices).

No test touches the network: downloads come from file:// mirrors in a temporary folder.
"""

import gzip
import hashlib
import shutil
import time

import numpy as np
import pytest

import fuseflow.data as ffd
from fuseflow import random
from fuseflow.data import _mnist

_CODES = {np.dtype("u1"): 0x08, np.dtype("i1"): 0x09, np.dtype("i2"): 0x0B,
          np.dtype("i4"): 0x0C, np.dtype("f4"): 0x0D, np.dtype("f8"): 0x0E}
_NAMES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def idx_bytes(arr) -> bytes:
    """An independent IDX writer: the bytes the format spec prescribes for ``arr``."""
    arr = np.asarray(arr)
    header = bytes([0, 0, _CODES[arr.dtype], arr.ndim])
    dims = np.array(arr.shape, dtype=">u4").tobytes()
    return header + dims + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def write(path, data: bytes, gz: bool):
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def fake_mnist(folder, n=20, gz=True, splits=("train", "test"), seed=0):
    """A tiny MNIST-shaped data set; images[i] is filled with 10 * label[i] for checking."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for split in splits:
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = np.repeat(labels * 10, 28 * 28).reshape(n, 28, 28).astype(np.uint8)
        suffix = ".gz" if gz else ""
        write(folder / (_NAMES[split][0] + suffix), idx_bytes(images), gz)
        write(folder / (_NAMES[split][1] + suffix), idx_bytes(labels), gz)
    return folder


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No FUSEFLOW_DATA, an empty cache under tmp_path, and mirrors that serve nothing."""
    monkeypatch.delenv("FUSEFLOW_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    empty = tmp_path / "empty-mirror"
    empty.mkdir()
    monkeypatch.setattr(_mnist, "MIRRORS", (empty.as_uri() + "/",))
    return tmp_path


# ----------------------------------------------------------------------------- IDX files

@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("dtype", ["u1", "i1", "i2", "i4", "f4", "f8"])
def test_read_idx_round_trips_every_type(tmp_path, dtype, gz):
    arr = (np.arange(2 * 3 * 4) - 7).reshape(2, 3, 4).astype(dtype)
    path = write(tmp_path / "a.idx", idx_bytes(arr), gz)
    out = ffd.read_idx(path)
    assert out.dtype == np.dtype(dtype) and out.dtype.isnative
    np.testing.assert_array_equal(out, arr)


GOOD = idx_bytes(np.arange(12, dtype=np.uint8).reshape(3, 4))


@pytest.mark.parametrize("data, message", [
    (b"", "too short"),
    (b"\x00\x00", "too short"),
    (b"\x01\x02\x08\x01" + GOOD[4:], "not an IDX file"),
    (GOOD[:2] + b"\x07" + GOOD[3:], "unknown IDX data type code 0x07"),
    (b"\x00\x00\x08\x00", "0 dimensions"),
    (GOOD[:10], "truncated inside its header"),
    (GOOD[:-1], "truncated: dims (3, 4) of uint8 need 12 payload bytes, found 11"),
    (GOOD + b"\x00\x00", "2 unexpected bytes after the payload"),
    # more dimensions than an array can have: not NumPy's bare "maximum supported dimension"
    (bytes([0, 0, 8, 65]) + b"\0\0\0\1" * 65 + b"\0", "declares 65 dimensions"),
    # dims whose product overflows int64: the size is reported exactly, not wrapped around
    (bytes([0, 0, 8, 4]) + b"\xff" * 16 + b"\0",
     f"need {(2 ** 32 - 1) ** 4} payload bytes, found 1"),
])
def test_damaged_idx_says_what_and_how_to_fix(tmp_path, data, message):
    path = write(tmp_path / "bad-idx3-ubyte", data, gz=False)
    with pytest.raises(ffd.DatasetError, match="bad-idx3-ubyte") as err:
        ffd.read_idx(path)
    assert message in str(err.value) and "delete it" in str(err.value)


def test_bad_gzip_is_a_dataset_error(tmp_path):
    packed = gzip.compress(GOOD)
    cut = write(tmp_path / "cut.gz", packed[:-6], gz=False)
    flipped = bytearray(packed)
    flipped[-6] ^= 0xFF  # inside the CRC trailer
    garbled = write(tmp_path / "garbled.gz", bytes(flipped), gz=False)
    for path in (cut, garbled):
        with pytest.raises(ffd.DatasetError, match=f"{path.name}: is not a valid gzip stream"):
            ffd.read_idx(path)


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[:-5])


def test_damaged_file_fix_says_where_to_get_it_again(isolated, monkeypatch):
    """Only fuseflow's cache is downloaded again; a file in the user's folder (data_dir,
    FUSEFLOW_DATA, idx_dataset) is to be restored from wherever it came from."""
    user = fake_mnist(isolated / "mine", n=4, gz=False, splits=("test",))
    _truncate(user / _NAMES["test"][0])
    for call in (lambda: ffd.mnist("test", data_dir=user),
                 lambda: ffd.idx_dataset(user, "test")):
        with pytest.raises(ffd.DatasetError, match="t10k-images-idx3-ubyte: is truncated") as err:
            call()
        assert "restore it from its source" in str(err.value)
        assert "re-downloads" not in str(err.value) and "downloads it again" not in str(err.value)
    monkeypatch.setenv("FUSEFLOW_DATA", str(user))
    with pytest.raises(ffd.DatasetError, match="restore it from its source"):
        ffd.mnist("test")
    monkeypatch.delenv("FUSEFLOW_DATA")
    cached = fake_mnist(_mnist.cache_dir(), n=4, gz=False, splits=("test",))  # raw: no sha256
    _truncate(cached / _NAMES["test"][0])
    with pytest.raises(ffd.DatasetError, match="is truncated") as err:
        ffd.mnist("test")
    assert "in fuseflow's cache" in str(err.value)
    assert "the next call downloads it again" in str(err.value)
    assert "restore it from its source" not in str(err.value)


def test_idx_dataset_label_out_of_range_names_num_classes(tmp_path):
    folder = fake_mnist(tmp_path / "d", n=5, gz=False, splits=("test",))
    write(folder / _NAMES["test"][1], idx_bytes(np.array([0, 10, 3, 11, 2], np.uint8)), gz=False)
    with pytest.raises(ffd.DatasetError, match=r"label 10 at index 1 is out of range 0..9 "
                                               r"\(num_classes=10\)") as err:
        ffd.idx_dataset(folder, "test")
    message = str(err.value)
    assert "idx_dataset(..., num_classes=12)" in message and "num_classes=None" in message
    assert "download" not in message
    assert ffd.idx_dataset(folder, "test", num_classes=12)[1].tolist() == [0, 10, 3, 11, 2]


def test_idx_dataset_reads_flattens_and_scales(tmp_path):
    folder = fake_mnist(tmp_path / "fashion", n=7, gz=False)
    x, y = ffd.idx_dataset(folder, "test")
    assert x.shape == (7, 784) and x.dtype == np.float32 and y.dtype == np.int64
    np.testing.assert_array_equal(x, np.repeat(y[:, None] * 10 / 255.0, 784, 1).astype(np.float32))
    x[0, 0] = 5.0  # results are the caller's own: the cache is not touched
    assert ffd.idx_dataset(folder, "test")[0][0, 0] != 5.0


def test_idx_dataset_pair_checks(tmp_path):
    folder = fake_mnist(tmp_path / "d", n=5, gz=False)
    images, labels = (folder / n for n in _NAMES["train"])
    write(labels, idx_bytes(np.arange(4, dtype=np.uint8)), gz=False)
    with pytest.raises(ffd.DatasetError, match="holds 4 labels but .* holds 5 images"):
        ffd.idx_dataset(folder)
    write(labels, idx_bytes(np.array([1, 2, 12, 3, 4], dtype=np.uint8)), gz=False)
    with pytest.raises(ffd.DatasetError, match="label 12 at index 2 is out of range 0..9"):
        ffd.idx_dataset(folder)
    assert ffd.idx_dataset(folder, num_classes=None)[1].tolist() == [1, 2, 12, 3, 4]
    shutil.copy(labels, images)  # images and labels swapped
    with pytest.raises(ffd.DatasetError, match="should hold images.*not swapped"):
        ffd.idx_dataset(folder)


@pytest.mark.parametrize("gz", [False, True])
def test_dotted_file_names_are_read_too(isolated, gz):
    """Many MNIST copies (Kaggle's, among others) name the files train-images.idx3-ubyte."""
    folder = fake_mnist(isolated / "kaggle", n=6, gz=gz)
    for path in folder.iterdir():
        path.rename(folder / path.name.replace("-idx", ".idx"))
    assert (folder / f"t10k-labels.idx1-ubyte{'.gz' if gz else ''}").is_file()
    x, y = ffd.mnist("test", data_dir=folder)
    np.testing.assert_allclose(x[:, 0] * 255, y * 10, rtol=1e-6)
    assert len(ffd.idx_dataset(folder, "train")[0]) == 6


def test_idx_dataset_missing_folder_and_bad_split(tmp_path):
    with pytest.raises(ffd.DatasetNotFoundError, match="t10k-images-idx3-ubyte"):
        ffd.idx_dataset(tmp_path, "test")
    with pytest.raises(ValueError, match="expected 'train' or 'test'"):
        ffd.idx_dataset(tmp_path, "validation")


# ----------------------------------------------------------------------- MNIST look-up

def test_mnist_data_dir_is_the_folder_or_holds_mnist(isolated):
    fake_mnist(isolated / "data" / "mnist", n=3)
    assert len(ffd.mnist("train", data_dir=isolated / "data" / "mnist")[0]) == 3
    assert len(ffd.mnist("test", data_dir=str(isolated / "data"))[0]) == 3


def test_mnist_look_up_order(isolated, monkeypatch):
    fake_mnist(isolated / "arg", n=3)
    fake_mnist(isolated / "env" / "mnist", n=4)
    fake_mnist(_mnist.cache_dir(), n=5)
    monkeypatch.setattr(_mnist, "SHA256", {})  # the fake cache has no canonical checksums
    monkeypatch.setenv("FUSEFLOW_DATA", str(isolated / "env"))
    assert len(ffd.mnist("test", data_dir=isolated / "arg")[1]) == 3
    assert len(ffd.mnist("test")[1]) == 4
    with pytest.raises(ffd.DatasetNotFoundError, match="only place looked"):
        ffd.mnist("test", data_dir=isolated / "nowhere")  # an explicit folder: no fallback
    monkeypatch.delenv("FUSEFLOW_DATA")
    assert len(ffd.mnist("test")[1]) == 5


def test_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert ffd.cache_dir() == tmp_path / "fuseflow" / "mnist"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ffd.cache_dir() == tmp_path / "home" / ".cache" / "fuseflow" / "mnist"


def test_mnist_nowhere_lists_every_place_and_the_fix(isolated, monkeypatch):
    monkeypatch.setenv("FUSEFLOW_DATA", str(isolated / "envdata"))
    with pytest.raises(FileNotFoundError) as err:
        ffd.mnist("train")
    msg = str(err.value)
    assert isinstance(err.value, ffd.DatasetNotFoundError)
    for place in (isolated / "envdata" / "mnist", isolated / "envdata", _mnist.cache_dir()):
        assert str(place) in msg
    for fix in ("data_dir=", "FUSEFLOW_DATA", "fuseflow train --data-dir", "could not download"):
        assert fix in msg
    assert not _mnist.cache_dir().exists() or not any(_mnist.cache_dir().iterdir())
    with pytest.raises(ffd.DatasetNotFoundError, match=r"download=False"):
        ffd.mnist("test", download=False)


def test_mnist_downloads_verifies_and_then_uses_the_cache(isolated, monkeypatch, mnist_dir):
    bad, good = isolated / "bad-mirror", isolated / "good-mirror"
    fake_mnist(bad, n=2, splits=("test",))  # right names, wrong bytes
    good.mkdir()
    for name in _NAMES["test"]:
        shutil.copy(mnist_dir / (name + ".gz"), good)
    monkeypatch.setattr(_mnist, "MIRRORS", (bad.as_uri(), good.as_uri() + "/"))
    x, y = ffd.mnist("test")
    assert x.shape == (10000, 784) and y[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    assert sorted(p.name for p in _mnist.cache_dir().iterdir()) == sorted(
        n + ".gz" for n in _NAMES["test"])  # no temporary files left behind
    shutil.rmtree(good)
    np.testing.assert_array_equal(ffd.mnist("test")[1], y)  # offline now: served by the cache


def test_download_with_only_a_bad_mirror_leaves_no_file(isolated, monkeypatch):
    bad = fake_mnist(isolated / "bad-mirror", n=2, splits=("test",))
    monkeypatch.setattr(_mnist, "MIRRORS", (bad.as_uri(),))
    with pytest.raises(ffd.DatasetNotFoundError, match="does not match the expected"):
        ffd.mnist("test")
    assert not _mnist.cache_dir().exists()  # no file, and no empty folder either


def test_damaged_cache_file_is_named_with_the_fix(isolated):
    fake_mnist(_mnist.cache_dir(), n=2, splits=("test",))
    with pytest.raises(ffd.DatasetError, match=r"t10k-images-idx3-ubyte.gz: sha256 is .*delete"):
        ffd.mnist("test")


# ---------------------------------------------------------------------- the real MNIST

def test_real_mnist(mnist_dir):
    for name, digest in _mnist.SHA256.items():
        assert hashlib.sha256((mnist_dir / name).read_bytes()).hexdigest() == digest, name
    start = time.perf_counter()
    (xtr, ytr), (xte, yte) = (ffd.mnist(s, data_dir=mnist_dir) for s in ("train", "test"))
    seconds = time.perf_counter() - start
    assert xtr.shape == (60000, 784) and xte.shape == (10000, 784)
    assert ytr.shape == (60000,) and yte.shape == (10000,)
    for x, y in ((xtr, ytr), (xte, yte)):
        assert x.dtype == np.float32 and y.dtype == np.int64
        assert x.min() == 0.0 and x.max() == 1.0
        assert 0.11 < x.mean() < 0.15  # MNIST's mean pixel is about 0.13
        counts = np.bincount(y, minlength=10)
        assert len(counts) == 10 and counts.min() > 0.08 * len(y) and counts.max() < 0.12 * len(y)
    assert ytr[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert np.bincount(ytr).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert seconds < 30, f"loading MNIST took {seconds:.1f}s"


# ------------------------------------------------------------------------------ digits

def test_digits_split_is_fixed_stratified_and_disjoint():
    (xtr, ytr), (xte, yte) = ffd.digits("train"), ffd.digits("test")
    assert xtr.shape == (1438, 64) and xte.shape == (359, 64)
    for x, y in ((xtr, ytr), (xte, yte)):
        assert x.dtype == np.float32 and y.dtype == np.int64
        assert x.min() == 0.0 and x.max() == 1.0
    assert np.bincount(yte).min() >= 35 and np.bincount(yte).max() <= 37
    from sklearn.datasets import load_digits

    d = load_digits()
    both = np.concatenate([xtr, xte]) * 16
    assert sorted(map(bytes, both.astype(np.uint8))) == sorted(map(bytes, d.data.astype(np.uint8)))
    np.testing.assert_array_equal(ffd.digits("test")[1], yte)
    with pytest.raises(ValueError, match="expected 'train' or 'test'"):
        ffd.digits("val")


# ----------------------------------------------------------------------------- batches

def labelled(n):
    """x rows that carry their own index, so every batch can be checked against y."""
    return np.arange(n, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32), np.arange(n)


@pytest.mark.parametrize("n, bs, drop_last", [(10, 3, False), (10, 3, True), (9, 3, False),
                                              (9, 3, True), (2, 5, False), (2, 5, True),
                                              (0, 4, False)])
def test_in_order_batches_cover_the_data(n, bs, drop_last):
    x, y = labelled(n)
    out = list(ffd.batches(x, y, bs, shuffle=False, drop_last=drop_last))
    assert len(out) == ffd.num_batches(n, bs, drop_last)
    assert all(len(xb) == bs for xb, _ in out[:-1])
    seen = np.concatenate([yb for _, yb in out]) if out else np.array([], int)
    assert seen.tolist() == list(range(len(out) * bs if drop_last else n))
    for xb, yb in out:
        np.testing.assert_array_equal(xb[:, 0], yb)
    for start in range(len(out) + 1):  # in order too, start_batch skips exactly those batches
        later = list(ffd.batches(x, y, bs, shuffle=False, drop_last=drop_last,
                                 start_batch=start))
        assert [yb.tolist() for _, yb in later] == [yb.tolist() for _, yb in out[start:]]


def test_shuffled_order_is_the_key_permutation():
    x, y = labelled(103)
    k = random.key(7)
    out = list(ffd.batches(x, y, 10, key=k))
    order = np.concatenate([yb for _, yb in out])
    np.testing.assert_array_equal(order, random.permutation(k, 103))
    for xb, yb in out:
        np.testing.assert_array_equal(xb[:, 0], yb)
    again = np.concatenate([yb for _, yb in ffd.batches(x, y, 10, key=k)])
    other = np.concatenate([yb for _, yb in ffd.batches(x, y, 10, key=random.key(8))])
    np.testing.assert_array_equal(again, order)
    assert not np.array_equal(other, order)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("start", [0, 1, 5, 10, 11])
def test_start_batch_resumes_bit_for_bit(start, drop_last, monkeypatch):
    """Gathered once per epoch (the default) or batch by batch (data sets over
    EPOCH_GATHER_MAX_BYTES): the same batches, from any start."""
    import fuseflow.data._batches as B

    x, y = labelled(105)
    k = random.fold_in(random.key(0), 3)
    full = list(ffd.batches(x, y, 10, key=k, drop_last=drop_last))
    start = min(start, len(full))  # 10 batches with drop_last, 11 without
    for limit in (B.EPOCH_GATHER_MAX_BYTES, 0):
        monkeypatch.setattr(B, "EPOCH_GATHER_MAX_BYTES", limit)
        resumed = list(ffd.batches(x, y, 10, key=k, start_batch=start, drop_last=drop_last))
        assert len(resumed) == len(full) - start
        for (a, b), (c, d) in zip(full[start:], resumed):
            np.testing.assert_array_equal(a, c)
            np.testing.assert_array_equal(b, d)
            assert c.flags.c_contiguous  # the compiled step's fast path takes it as is


@pytest.mark.parametrize("call, message", [
    (lambda x, y: ffd.batches(x, y, 4), "needs a key"),
    (lambda x, y: ffd.batches(x, y[:-1], 4, shuffle=False), "x has 10 rows but y has 9"),
    (lambda x, y: ffd.batches(x, y, 0, shuffle=False), "positive int"),
    (lambda x, y: ffd.batches(x, y, 2.0, shuffle=False), "positive int"),
    (lambda x, y: ffd.batches(x, y, 4, shuffle=False, start_batch=4), r"outside 0..3"),
    (lambda x, y: ffd.batches(x, y, 4, shuffle=False, start_batch=-1), r"outside 0..3"),
])
def test_batches_errors_are_raised_at_the_call(call, message):
    x, y = labelled(10)
    with pytest.raises(ValueError, match=message):
        call(x, y)  # not only once iteration starts


def test_batch_size_and_start_batch_take_any_integer():
    """NumPy integers (and 0-d integer arrays) work wherever an int does."""
    x, y = labelled(10)
    k = random.key(3)
    for bs in (np.int64(4), np.int32(4), np.uint8(4), np.array(4)):
        assert ffd.num_batches(10, bs) == 3 and type(ffd.num_batches(10, bs)) is int
        assert [len(b) for _, b in ffd.batches(x, y, bs, shuffle=False)] == [4, 4, 2]
        assert [len(b) for _, b in ffd.device_batches(x, y, bs, key=k)] == [4, 4]
    want = [b.tolist() for _, b in ffd.batches(x, y, 4, key=k, start_batch=1)]
    got = [b.tolist() for _, b in ffd.batches(x, y, np.int64(4), key=k, start_batch=np.int64(1))]
    assert got == want


@pytest.mark.parametrize("call, message", [
    (lambda x, y: ffd.batches(x, y, 4, key=random.key(0), start_batch=1.5),
     r"ff.data.batches: start_batch must be an int .*got float 1.5"),
    (lambda x, y: ffd.batches(x, y, 4, shuffle=False, start_batch="1"),
     r"start_batch must be an int .*got str '1'"),
    (lambda x, y: ffd.batches(x, y, 4, shuffle=False, start_batch=True), "start_batch must be"),
    (lambda x, y: ffd.batches(x, y, True, shuffle=False),
     r"batch_size must be a positive int \(a .*got bool True"),
    (lambda x, y: ffd.batches(x, y, np.float64(4.0), shuffle=False),
     r"ff.data.batches: batch_size must be a positive int \(a .*Fix: batch_size=4\."),
    (lambda x, y: ffd.batches(x, y, np.int64(0), shuffle=False),
     r"batch_size must be a positive int, got 0"),
    (lambda x, y: ffd.device_batches(x, y, 2.5, key=random.key(0)),
     r"ff.data.device_batches: batch_size must be a positive int \(a .*float 2.5"),
    (lambda x, y: ffd.num_batches(10, "4"),
     r"ff.data.num_batches: batch_size must be a positive int \(a .*got str '4'"),
])
def test_non_integer_batch_arguments_are_named(call, message):
    x, y = labelled(10)
    with pytest.raises(ValueError, match=message):
        call(x, y)  # at the call, not once iteration starts


@pytest.mark.parametrize("key, error, message", [
    (None, ValueError, "needs a key"),
    (7, TypeError, r"expected a key \(uint32 array of shape \(2,\)\), got dtype int64 shape \(\)"),
    (np.array([1], np.uint32), TypeError, r"got dtype uint32 shape \(1,\)"),
    ([-1, -1], TypeError, r"got dtype int64 shape \(2,\)"),
    (np.zeros((2, 2), np.uint32), TypeError, r"shape \(2, 2\)"),
])
def test_device_batches_checks_its_key_at_the_call(key, error, message):
    x, y = labelled(10)
    with pytest.raises(error, match=f"ff.data.device_batches.*{message}"):
        ffd.device_batches(x, y, 4, key=key)  # not only at the first next()


def test_device_batches_checks_lengths_at_the_call():
    x, y = labelled(10)
    with pytest.raises(ValueError, match="device_batches: x has 10 rows but y has 9"):
        ffd.device_batches(x, y[:-1], 4, key=random.key(0))
    with pytest.raises(ValueError, match="device_batches: batch_size must be a positive int"):
        ffd.device_batches(x, y, 0, key=random.key(0))


@pytest.mark.gpu
def test_batches_on_cupy_arrays_match_numpy():
    cp = pytest.importorskip("cupy")
    try:
        cp.cuda.runtime.getDeviceCount()
    except cp.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA device")
    x, y = labelled(50)
    k = random.key(1)
    host = list(ffd.batches(x, y, 8, key=k, start_batch=2))
    dev = list(ffd.batches(cp.asarray(x), cp.asarray(y), 8, key=k, start_batch=2))
    assert len(host) == len(dev)
    for (a, b), (c, d) in zip(host, dev):
        assert isinstance(c, cp.ndarray) and isinstance(d, cp.ndarray)
        np.testing.assert_array_equal(a, c.get())
        np.testing.assert_array_equal(b, d.get())


@pytest.mark.parametrize("drop_last", [False, True])
def test_device_batches_run_on_numpy_with_any_key(drop_last):
    """The same loop runs on a CPU: every row once per epoch, a fixed order per key, for
    keys made by fold_in and split (64-bit seeds, which NumPy's RandomState refused)."""
    x, y = labelled(53)
    keys = [random.fold_in(random.key(0), 3), random.split(random.key(9))[1], random.key(2)]
    orders = []
    for k in keys:
        out = list(ffd.device_batches(x, y, 8, key=k, drop_last=drop_last))
        assert len(out) == ffd.num_batches(53, 8, drop_last)
        for xb, yb in out:
            assert isinstance(xb, np.ndarray)
            np.testing.assert_array_equal(xb[:, 0], yb)
        seen = np.concatenate([yb for _, yb in out])
        assert len(set(seen.tolist())) == len(seen) == (48 if drop_last else 53)
        again = np.concatenate([yb for _, yb in ffd.device_batches(x, y, 8, key=k,
                                                                   drop_last=drop_last)])
        np.testing.assert_array_equal(seen, again)
        orders.append(seen)
    assert not np.array_equal(orders[0], orders[1])


@pytest.mark.gpu
@pytest.mark.parametrize("drop_last", [False, True])
def test_device_batches_cover_the_epoch_in_the_device_order(drop_last, monkeypatch):
    """device_batches: every row once per epoch in the order CuPy draws from the key, the
    same whether the epoch is gathered at once or batch by batch."""
    cp = pytest.importorskip("cupy")
    import fuseflow.data._batches as B

    if not cp.is_available():
        pytest.skip("no CUDA device")
    x, y = labelled(53)
    x, y = cp.asarray(x), cp.asarray(y)
    k = random.key(4)
    runs = []
    for limit in (B.EPOCH_GATHER_MAX_BYTES, 0):
        monkeypatch.setattr(B, "EPOCH_GATHER_MAX_BYTES", limit)
        out = list(ffd.device_batches(x, y, 8, key=k, drop_last=drop_last))
        assert len(out) == ffd.num_batches(53, 8, drop_last)
        for xb, yb in out:
            np.testing.assert_array_equal(xb[:, 0].get(), yb.get())
        runs.append(np.concatenate([yb.get() for _, yb in out]))
    np.testing.assert_array_equal(runs[0], runs[1])
    seen = runs[0]
    assert len(set(seen.tolist())) == len(seen) == (48 if drop_last else 53)
