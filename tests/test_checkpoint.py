"""fuseflow.checkpoint: round trips, `like` checks, damaged files, format versions, and
atomic writes under exceptions and SIGKILL."""

import json
import os
import random as pyrandom
import signal
import subprocess
import sys
import textwrap
import time
from typing import NamedTuple

import numpy as np
import pytest
import safetensors
import safetensors.numpy

from fuseflow import checkpoint as ckpt
from fuseflow import tree


class AdamState(NamedTuple):
    count: object
    mu: object
    nu: object


def sample_tree():
    rng = np.random.default_rng(0)
    return {
        "params": [{"w": rng.standard_normal((4, 3)).astype(np.float32),
                    "b": np.zeros(3, np.float16)},
                   {"w": rng.standard_normal((3, 2)), "b": np.arange(2, dtype=np.int32)}],
        "opt": AdamState(count=np.array(7, np.int64), mu=(np.ones(2, np.uint8), None),
                         nu={"big": np.arange(3, dtype=">i4"),
                             "strided": np.arange(12.0).reshape(3, 4)[:, ::2]}),
        "step": 12, "lr": 3e-4, "done": False, "loss": np.float32(0.25),
        "mask": np.array([True, False]), "empty": np.zeros((0, 5), np.float32),
        "nothing": None, 3: np.int8(-2),
    }


def assert_same(a, b):
    """Same leaves (values, dtypes, shapes and Python types) under the same paths."""
    assert tree.paths(a) == tree.paths(b)
    for (path, x), y in zip(tree.leaves_with_paths(a), tree.leaves(b)):
        assert type(x) is type(y), path
        if isinstance(x, (np.ndarray, np.generic)):
            assert x.dtype == y.dtype and x.shape == y.shape, path
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y, path


# --------------------------------------------------------------------------- round trips

def test_round_trip_without_like(tmp_path):
    t = sample_tree()
    ckpt.save(tmp_path / "c.safetensors", t)
    out = ckpt.load(tmp_path / "c.safetensors")
    big = out["opt"].nu["big"]
    assert big.dtype.isnative and big.tolist() == [0, 1, 2]  # byte order is normalised
    t["opt"].nu["big"] = t["opt"].nu["big"].astype(np.int32)
    assert_same(t, out)
    assert out["nothing"] is None and out["opt"].mu[1] is None
    assert isinstance(out["opt"].mu, tuple) and isinstance(out["params"], list)
    # a NamedTuple comes back as a namedtuple of the same name and fields
    assert type(out["opt"]).__name__ == "AdamState" and out["opt"]._fields == AdamState._fields
    assert tree.structure(ckpt.load(tmp_path / "c.safetensors")) == tree.structure(out)
    out["params"][0]["w"][0, 0] = 1.0  # loaded arrays are ordinary, writeable arrays


@pytest.mark.parametrize("dtype", ["bool", "u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8",
                                   "f2", "f4", "f8", ">f4", ">i8"])
def test_files_are_what_the_safetensors_library_writes(tmp_path, dtype):
    """save writes the format itself (straight from the arrays, no copy of the file in
    memory): the library reads back the same tensors, dtypes, shapes and metadata as from a
    file the library wrote, for every storable dtype, 0-d and empty arrays among them."""
    rng = np.random.default_rng(3)
    dt = np.dtype(dtype)
    arrays = {"m": rng.integers(0, 2, (3, 5)) if dt.kind == "b" else
              (rng.standard_normal((3, 5)) * 40), "z": np.zeros((0, 4)), "s": np.array(7)}
    t = {k: v.astype(dt) for k, v in arrays.items()}
    ckpt.save(tmp_path / "ours.safetensors", t, metadata={"note": "ü"})
    with safetensors.safe_open(tmp_path / "ours.safetensors", framework="np") as f:
        meta = f.metadata()
        ours = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    little = {k: v.astype(dt.newbyteorder("<")) for k, v in t.items()}
    safetensors.numpy.save_file(little, tmp_path / "lib.safetensors", metadata=meta)
    with safetensors.safe_open(tmp_path / "lib.safetensors", framework="np") as f:
        assert f.metadata() == meta and json.loads(meta["fuseflow_metadata"]) == {"note": "ü"}
        lib = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    assert sorted(ours) == sorted(lib) == ["m", "s", "z"]
    for k in lib:
        assert ours[k].dtype == lib[k].dtype and ours[k].shape == lib[k].shape == t[k].shape
        np.testing.assert_array_equal(ours[k], lib[k])
    size = (tmp_path / "ours.safetensors").stat().st_size
    assert size == 8 + int.from_bytes((tmp_path / "ours.safetensors").read_bytes()[:8],
                                      "little") + sum(a.nbytes for a in t.values())


def test_every_tensor_starts_at_a_multiple_of_its_item_size(tmp_path):
    """As the safetensors library lays files out (wider dtypes first), so that readers that
    map the file get aligned arrays: a TrainState-like tree of int64 counters, float16 and
    float32 leaves of odd sizes and a bool."""
    t = {"step": 3, "epoch": np.int32(1), "h": np.ones(5, np.float16), "w": np.ones((3, 3)),
         "f": np.ones(7, np.float32), "b": np.array([True, False, True]), "u": np.uint8(9)}
    ckpt.save(tmp_path / "c.safetensors", t)
    raw = (tmp_path / "c.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert (8 + n) % 8 == 0
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__")
    sizes = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "U8": 1, "BOOL": 1}
    for name, info in header.items():
        assert info["data_offsets"][0] % sizes[info["dtype"]] == 0, (name, info)
    back = ckpt.load(tmp_path / "c.safetensors", like=t)
    for a, b in zip(tree.leaves(back), tree.leaves(t)):
        np.testing.assert_array_equal(a, b)


def test_a_key_that_is_not_valid_unicode_is_refused_before_writing(tmp_path):
    path = tmp_path / "c.safetensors"
    ckpt.save(path, {"w": np.zeros(3)})
    key = os.fsdecode(b"w\xff")  # a lone surrogate: no UTF-8 header can hold it
    with pytest.raises(ckpt.CheckpointError, match="not valid Unicode text.*nothing was written"):
        ckpt.save(path, {key: np.ones(3)})
    assert ckpt.load(path)["w"].tolist() == [0, 0, 0]
    assert [p.name for p in tmp_path.iterdir()] == ["c.safetensors"]


def test_round_trip_with_like_keeps_like_types(tmp_path):
    t = sample_tree()
    t["opt"].nu["big"] = t["opt"].nu["big"].astype("<i4")
    ckpt.save(tmp_path / "c.safetensors", t)
    out = ckpt.load(tmp_path / "c.safetensors", like=t)
    assert type(out["opt"]) is AdamState
    assert tree.structure(out) == tree.structure(t)
    assert_same(t, out)


def test_single_leaf_and_empty_trees(tmp_path):
    for t in (np.arange(3.0), 5, None, {}, [], (np.array(1.0),)):
        ckpt.save(tmp_path / "c", t)
        out = ckpt.load(tmp_path / "c")
        assert tree.structure(out) == tree.structure(t)
        assert_same(t, out)


def test_tensor_names_are_the_leaf_paths(tmp_path):
    t = sample_tree()
    ckpt.save(tmp_path / "c.safetensors", t)
    with safetensors.safe_open(tmp_path / "c.safetensors", "np") as f:
        assert sorted(f.keys()) == sorted(tree.paths(t))
    assert "params/0/w" in tree.paths(t)


def test_user_metadata_round_trips(tmp_path):
    meta = {"step": 1200, "epoch": 3, "config": {"hidden": [128, 64], "lr": 1e-3},
            "note": "best so far", "ok": True, "none": None}
    ckpt.save(tmp_path / "c", {"w": np.ones(2)}, metadata=meta)
    assert ckpt.read_metadata(tmp_path / "c") == meta
    ckpt.save(tmp_path / "d", {"w": np.ones(2)})
    assert ckpt.read_metadata(tmp_path / "d") == {}


@pytest.mark.parametrize("t, meta, message", [
    ({"s": "relu"}, None, r"leaf 's' is a str"),
    ({"z": np.ones(2, np.complex64)}, None, r"leaf 'z' has dtype complex64"),
    ({(1, 2): np.ones(2)}, None, r"dict key \(1, 2\) at <root> is a tuple"),
    ({"opt": [{1.5: np.ones(2)}]}, None, r"dict key 1.5 at 'opt/0' is a float"),
    ({"a/b": np.ones(1), "a": {"b": np.ones(1)}}, None, "two leaves share the path 'a/b'"),
    ({"w": np.ones(2)}, {"loss": np.float32(1)}, "JSON-serialisable.*float\\(loss\\)"),
    ({"w": np.ones(2)}, [1, 2], "metadata must be a dict"),
])
def test_unsavable_input_is_refused_before_writing(tmp_path, t, meta, message):
    with pytest.raises(TypeError, match=message):
        ckpt.save(tmp_path / "c", t, metadata=meta)
    assert list(tmp_path.iterdir()) == []


# -------------------------------------------------------------------------- like checks

def test_another_models_checkpoint_lists_every_difference(tmp_path):
    mine = {"params": [{"w": np.zeros((784, 128), np.float32), "b": np.zeros(128, np.float32)},
                       {"w": np.zeros((128, 10), np.float32), "b": np.zeros(10, np.float32)}],
            "step": 0}
    theirs = {"params": [{"w": np.zeros((784, 256), np.float32), "b": np.zeros(256, np.float16)},
                         {"w": np.zeros((256, 10), np.float32)}],
              "step": 1.5, "ema": np.zeros(3)}
    ckpt.save(tmp_path / "theirs.safetensors", theirs)
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.load(tmp_path / "theirs.safetensors", like=mine)
    msg = str(err.value)
    expected = [
        "theirs.safetensors does not match like (7 differences)",
        "'params/0/w': shape expected (784, 128), found (784, 256)",
        "'params/0/b': shape expected (128,), found (256,)",
        "'params/0/b': dtype expected float32, found float16",
        "'params/1/w': shape expected (128, 10), found (256, 10)",
        "missing from the file: 'params/1/b' (like has float32 of shape (10,))",
        "'step': dtype expected int64, found float64",
        "not in like: 'ema' (the file has float64 of shape (3,))",
        "Fix:",
    ]
    for line in expected:
        assert line in msg, f"{line!r} not in:\n{msg}"
    # every differing name, also those differing in shape only or missing from the file
    # (load_state reads them to tell a changed model from a changed optimizer)
    assert set(err.value.paths) == {"params/0/w", "params/0/b", "params/1/w", "params/1/b",
                                    "step", "ema"}


def test_like_that_matches_loads_values(tmp_path):
    ckpt.save(tmp_path / "c", {"w": np.arange(4.0), "n": 3})
    out = ckpt.load(tmp_path / "c", like={"w": np.zeros(4), "n": 0})
    assert out["w"].tolist() == [0, 1, 2, 3] and out["n"] == 3 and type(out["n"]) is int


# ---------------------------------------------------------------------- damaged files

def saved(tmp_path):
    path = tmp_path / "c.safetensors"
    ckpt.save(path, {"w": np.arange(64, dtype=np.float32), "b": np.ones(3)}, metadata={"s": 1})
    return path, path.read_bytes()


def header_len(data: bytes) -> int:
    return 8 + int.from_bytes(data[:8], "little")


@pytest.mark.parametrize("where", ["length", "json-open", "json-middle", "json-end"])
def test_flipped_header_byte_is_a_checkpoint_error(tmp_path, where):
    path, data = saved(tmp_path)
    pos = {"length": 1, "json-open": 8, "json-middle": header_len(data) // 2,
           "json-end": header_len(data) - 2}[where]
    bad = bytearray(data)
    bad[pos] ^= 0x5A
    path.write_bytes(bytes(bad))
    with pytest.raises(ckpt.CheckpointError, match="c.safetensors"):
        ckpt.load(path)


def test_flipped_data_byte_names_the_tensor(tmp_path):
    path, data = saved(tmp_path)
    bad = bytearray(data)
    bad[-1] ^= 0x01
    path.write_bytes(bytes(bad))
    with pytest.raises(ckpt.CheckpointError, match=r"c.safetensors: tensor '\w' does not match "
                                                    r"the CRC-32.*corrupted"):
        ckpt.load(path)


def test_find_exact_names_the_file_that_holds_the_tree(tmp_path):
    """Among near-misses (one bit of one leaf changed, a Python int changed, another
    structure, not a checkpoint, missing), only the file saved from the tree matches, big-
    endian leaves and all; a tree matched by none gives None."""
    t = sample_tree()
    nudged = sample_tree()
    nudged["params"][0]["w"].view(np.uint32)[1, 2] ^= 1
    files = {"nudged": nudged, "step": dict(sample_tree(), step=13),
             "fewer": {k: v for k, v in sample_tree().items() if k != "lr"}, "same": t}
    for name, value in files.items():
        ckpt.save(tmp_path / f"{name}.safetensors", value)
    safetensors.numpy.save_file({"w": np.ones(3, np.float32)}, tmp_path / "plain.safetensors")
    candidates = [tmp_path / f"{n}.safetensors" for n in ("missing", "plain", *files)]
    assert ckpt.find_exact(candidates, t) == tmp_path / "same.safetensors"
    assert ckpt.find_exact(candidates[:-1], t) is None
    assert ckpt.find_exact(candidates, nudged) == tmp_path / "nudged.safetensors"


def test_find_exact_confirms_the_bytes_behind_matching_checksums(tmp_path):
    """A file whose data was changed after saving still records the tree's checksums in its
    header: it is read and refused, not taken on its header's word."""
    path, data = saved(tmp_path)
    tree_saved = {"w": np.arange(64, dtype=np.float32), "b": np.ones(3)}
    assert ckpt.find_exact([path], tree_saved) == path
    bad = bytearray(data)
    bad[-1] ^= 0x01
    path.write_bytes(bytes(bad))
    assert ckpt.find_exact([path], tree_saved) is None


@pytest.mark.parametrize("keep", [0, 4, 8, 20, "header-1", "header", "end-1"])
def test_truncated_file_is_a_checkpoint_error(tmp_path, keep):
    path, data = saved(tmp_path)
    n = {"header-1": header_len(data) - 1, "header": header_len(data),
         "end-1": len(data) - 1}.get(keep, keep)
    path.write_bytes(data[:n])
    with pytest.raises(ckpt.CheckpointError, match="c.safetensors: not a readable safetensors "
                                                   "file; it is truncated"):
        ckpt.load(path)


def test_files_that_are_not_fuseflow_checkpoints(tmp_path):
    np.save(tmp_path / "a.npy", np.ones(3))
    with pytest.raises(ckpt.CheckpointError, match="a.npy: not a readable safetensors"):
        ckpt.load(tmp_path / "a.npy")
    safetensors.numpy.save_file({"w": np.ones(3)}, tmp_path / "plain.safetensors")
    with pytest.raises(ckpt.CheckpointError, match="plain.safetensors: a safetensors file, but "
                                                   "not a fuseflow checkpoint"):
        ckpt.load(tmp_path / "plain.safetensors")
    with pytest.raises(FileNotFoundError):
        ckpt.load(tmp_path / "missing.safetensors")
    with pytest.raises(IsADirectoryError, match="is a folder; .* expect the checkpoint file"):
        ckpt.load(tmp_path)


def write_with_header(path, **changes):
    """A checkpoint whose fuseflow metadata entries are replaced by ``changes``."""
    t = {"w": np.ones(2, np.float32)}
    ckpt.save(path, t)
    with safetensors.safe_open(path, "np") as f:
        meta = dict(f.metadata())
    meta.update(changes)
    safetensors.numpy.save_file(t, path, metadata=meta)


def test_format_version_is_checked(tmp_path):
    path = tmp_path / "c"
    write_with_header(path, fuseflow_format_version=str(ckpt.FORMAT_VERSION + 1))
    for read in (ckpt.load, ckpt.read_metadata):
        with pytest.raises(ckpt.CheckpointError, match=f"format {ckpt.FORMAT_VERSION + 1}, but "
                                                       "this fuseflow reads.*upgrade fuseflow"):
            read(path)
    write_with_header(path, fuseflow_format_version="one")
    with pytest.raises(ckpt.CheckpointError, match="not an integer"):
        ckpt.load(path)


@pytest.mark.parametrize("tree_json", ["{not json", json.dumps({"dict": [["w"]]}),
                                       json.dumps({"dict": [["v", {"leaf": "v", "kind": "array",
                                                                   "crc32": 0}]]})])
def test_malformed_structure_is_a_checkpoint_error(tmp_path, tree_json):
    write_with_header(tmp_path / "c", fuseflow_tree=tree_json)
    with pytest.raises(ckpt.CheckpointError, match="corrupted"):
        ckpt.load(tmp_path / "c")


# ----------------------------------------------------------------------- atomic writes

def test_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path, monkeypatch):
    path = tmp_path / "c.safetensors"
    ckpt.save(path, {"w": np.zeros(3)})
    for error in (OSError("disk full"), KeyboardInterrupt()):
        def fail(fd, error=error):
            raise error

        monkeypatch.setattr(os, "fsync", fail)
        with pytest.raises(type(error)):
            ckpt.save(path, {"w": np.ones(3)})
        monkeypatch.undo()
        assert ckpt.load(path)["w"].tolist() == [0, 0, 0]
        assert [p.name for p in tmp_path.iterdir()] == ["c.safetensors"]


def test_save_creates_parent_folders_and_replaces(tmp_path):
    path = tmp_path / "run" / "a" / "c.safetensors"
    ckpt.save(path, {"w": np.zeros(2)})
    ckpt.save(path, {"w": np.ones(2)})
    assert ckpt.load(path)["w"].tolist() == [1, 1]
    assert os.listdir(path.parent) == ["c.safetensors"]


def test_atomic_write_is_all_or_nothing_in_text_and_binary(tmp_path):
    # the helper behind checkpoint.save, the download, metrics.jsonl and curves.png
    from fuseflow._files import atomic_write

    path = tmp_path / "sub" / "f.txt"
    with atomic_write(path, "w") as f:
        f.write("old\n")
    for mode, data in (("w", "new\n"), ("wb", b"new\n")):
        with pytest.raises(RuntimeError), atomic_write(path, mode, suffix=".part") as f:
            f.write(data)
            assert [p.name for p in path.parent.iterdir() if p.name.endswith(".part")]
            raise RuntimeError("stop before the end")
        assert path.read_text() == "old\n" and os.listdir(path.parent) == ["f.txt"]
    with atomic_write(path) as f:
        f.write(b"new\n")
    assert path.read_text() == "new\n" and os.listdir(path.parent) == ["f.txt"]
    with pytest.raises(ValueError, match="mode"), atomic_write(path, "a"):
        pass


_SAVER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from fuseflow import checkpoint
    path, hang = sys.argv[1], sys.argv[2] == "hang"
    w = np.empty(4_000_000, np.float32)  # 16 MB per save, so kills can land mid-write
    step = 0
    while True:
        w.fill(step)
        checkpoint.save(path, {"w": w, "step": step}, metadata={"step": step})
        print(step, flush=True)
        step += 1
        if hang:  # the next save stops with its temporary file written, before the rename
            os.fsync = lambda fd: (print("syncing", flush=True), time.sleep(60))
""")


def kill_saver(path, hang=False, delay=0.0):
    """Start the saver, let it complete one save, wait, SIGKILL it; return what it printed."""
    proc = subprocess.Popen([sys.executable, "-c", _SAVER, str(path), "hang" if hang else "-"],
                            stdout=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline().strip()]
        assert lines[0] == "0", lines  # the first save has completed
        if hang:
            lines.append(proc.stdout.readline().strip())
        time.sleep(delay)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    return lines


def check_survivor(path):
    """The checkpoint at ``path`` is whole and self-consistent; only hidden temporaries of an
    interrupted save lie beside it. Returns its step."""
    out = ckpt.load(path)
    step = out["step"]
    assert ckpt.read_metadata(path) == {"step": step}
    assert out["w"].shape == (4_000_000,) and out["w"].min() == out["w"].max() == step
    for p in path.parent.iterdir():
        assert p == path or (p.name.startswith(".tmp-") and p.name.endswith(".tmp")), p
    return step


def test_sigkill_at_random_moments_of_saving_leaves_a_whole_checkpoint(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    rng = pyrandom.Random(1234)
    steps = []
    for _ in range(8):
        kill_saver(path, delay=rng.uniform(0.0, 0.4))
        steps.append(check_survivor(path))
    assert any(s > 0 for s in steps), steps  # the kills did interrupt a run of saves


def test_sigkill_after_the_write_before_the_rename_keeps_the_old_checkpoint(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    assert kill_saver(path, hang=True) == ["0", "syncing"]
    assert check_survivor(path) == 0
    leftovers = [p for p in tmp_path.iterdir() if p != path]
    assert len(leftovers) == 1  # the documented hidden temporary; the final name is intact


@pytest.mark.gpu
def test_cupy_leaves_are_saved_from_and_loaded_to_the_gpu(tmp_path):
    cp = pytest.importorskip("cupy")
    try:
        cp.cuda.runtime.getDeviceCount()
    except cp.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA device")
    t = {"w": cp.arange(6, dtype=cp.float32).reshape(2, 3), "b": np.ones(2), "n": 4}
    ckpt.save(tmp_path / "c", t)
    host = ckpt.load(tmp_path / "c")
    assert isinstance(host["w"], np.ndarray) and host["w"].tolist() == [[0, 1, 2], [3, 4, 5]]
    dev = ckpt.load(tmp_path / "c", like=t)
    assert isinstance(dev["w"], cp.ndarray) and isinstance(dev["b"], np.ndarray)
    assert dev["w"].device == t["w"].device
    cp.testing.assert_array_equal(dev["w"], t["w"])


def test_longest_file_name_can_be_saved_and_failures_leave_no_temporary(tmp_path, monkeypatch):
    # The temporary file's name used to be ".<name>.<pid>.<random>.tmp": ~19 characters longer
    # than the target's, so a name the file system accepts failed with "File name too long".
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    path = tmp_path / ("a" * (name_max - len(".safetensors")) + ".safetensors")
    assert len(path.name) == name_max
    path.write_bytes(b"")  # the OS takes the name itself
    path.unlink()
    ckpt.save(path, {"w": np.zeros(3)})
    assert ckpt.load(path)["w"].tolist() == [0, 0, 0]
    assert os.listdir(tmp_path) == [path.name]

    from fuseflow._files import atomic_write
    with atomic_write(path) as f:  # the temporary: short, hidden, beside the target
        (tmp,) = [p for p in os.listdir(tmp_path) if p != path.name]
        assert tmp.startswith(".tmp-") and tmp.endswith(".tmp") and len(tmp) < 40, tmp
        f.write(b"x")
    assert os.listdir(tmp_path) == [path.name] and path.read_bytes() == b"x"

    ckpt.save(path, {"w": np.zeros(3)})
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        ckpt.save(path, {"w": np.ones(3)})
    monkeypatch.undo()
    assert ckpt.load(path)["w"].tolist() == [0, 0, 0] and os.listdir(tmp_path) == [path.name]


@pytest.mark.parametrize("under", ["c.safetensors", "sub/c.safetensors"])
def test_save_under_a_file_names_the_file_and_touches_nothing(tmp_path, under):
    # was a bare "FileExistsError: [Errno 17] File exists" (or "Not a directory")
    blocker = tmp_path / "run"
    blocker.write_bytes(b"notes, not a folder")
    target = blocker / under
    with pytest.raises(NotADirectoryError) as err:
        ckpt.save(target, {"w": np.ones(2)})
    msg = str(err.value)
    assert msg.startswith(f"checkpoint.save: cannot write '{target}': '{blocker}' is a file, "
                          "not a folder"), msg
    assert f"Fix: write to another path, or move or rename '{blocker}'" in msg
    assert ".tmp" not in msg and "Errno" not in msg
    assert os.listdir(tmp_path) == ["run"] and blocker.read_bytes() == b"notes, not a folder"


@pytest.mark.parametrize("n", [2**63, -2**63 - 1, 10**100, 10**10000],
                         ids=["2**63", "-2**63-1", "10**100", "10**10000"])
def test_int_beyond_int64_names_the_leaf_and_the_fix(tmp_path, n):
    # was a bare "OverflowError: Python int too large to convert to C long"
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.save(tmp_path / "c", {"opt": [{"count": n}], "w": np.ones(2)})
    msg = str(err.value)
    assert msg.startswith("checkpoint.save: leaf 'opt/0/count' is the int "), msg
    assert "outside the int64 range (-9223372036854775808 to 9223372036854775807)" in msg
    assert "Fix: store it as a float" in msg and "metadata=" in msg and "array" in msg
    assert err.value.paths == ("opt/0/count",)
    assert len(msg) < 500  # a huge int is elided, not printed whole
    assert list(tmp_path.iterdir()) == []
    for edge in (2**63 - 1, -2**63):  # the ends of the range still round-trip exactly
        ckpt.save(tmp_path / "c", {"n": edge})
        assert ckpt.load(tmp_path / "c", like={"n": 0})["n"] == edge


def test_big_endian_arrays_load_with_the_like_they_were_saved_with(tmp_path):
    # was "'a': dtype expected >f4, found float32": byte order is not a difference
    t = {"a": np.arange(3, dtype=">f4"), "b": np.arange(4, dtype=">i8").reshape(2, 2),
         "c": np.ones(2, "<f4"), "d": np.array([1, 2], ">u2")}
    ckpt.save(tmp_path / "c", t)
    out = ckpt.load(tmp_path / "c", like=t)
    assert_same(t, out)  # dtypes included: arrays come back in like's byte order
    assert out["a"].dtype.str == ">f4" and out["a"].tolist() == [0, 1, 2]
    out["a"][0] = 5.0  # still an ordinary, writeable array
    native = ckpt.load(tmp_path / "c", like={k: v.astype(v.dtype.newbyteorder("="))
                                             for k, v in t.items()})
    assert all(v.dtype.isnative for v in native.values())
    assert native["b"].tolist() == [[0, 1], [2, 3]]
    ckpt.save(tmp_path / "n", {"a": np.arange(3, dtype="<f4")})  # and the other way round
    assert ckpt.load(tmp_path / "n", like={"a": np.zeros(3, ">f4")})["a"].dtype.str == ">f4"
    with pytest.raises(ckpt.CheckpointError, match=r"'a': dtype expected >f8, found float32"):
        ckpt.load(tmp_path / "c", like={**t, "a": np.zeros(3, ">f8")})  # a real difference


def test_namedtuple_classes_are_reused_across_loads(tmp_path):
    ckpt.save(tmp_path / "c", AdamState(1, 2, 3))
    a, b = ckpt.load(tmp_path / "c"), ckpt.load(tmp_path / "c")
    assert type(a) is type(b) and a == (1, 2, 3)
    assert isinstance(a, tuple) and hasattr(type(a), "_fields")
    assert not isinstance(a, AdamState)  # documented: the file cannot name the original class
