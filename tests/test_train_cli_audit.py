"""What a usability audit of the training loop and the CLI found, each case fixed and kept.

Every case here once misled a user: a resumed run on other data that trained nothing and
reported success, a finished run resumed without a word, a note printed before the error
that contradicted it, wrong arguments failing only at the first step, and messages that
showed internal names or probe shapes instead of what the user passed.
"""

from __future__ import annotations

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn
from fuseflow import train as T
from tests.test_cli_safety import (DIGITS, IDX_NAMES, SMALL, assert_one_line_error, idx_folder,
                                   write_idx)


@pytest.fixture(scope="module")
def idx_run(tmp_path_factory):
    """A finished 1-epoch run on an IDX copy of the digits, and that data's folder."""
    from fuseflow.cli import main

    root = tmp_path_factory.mktemp("audit")
    data = idx_folder(root / "data" / "mnist")
    out = root / "run"
    assert main(["train", "--data-dir", str(root / "data"), "--epochs", "1", "--out", str(out),
                 *SMALL]) == 0
    return root, data, out


def test_the_recorded_data_folder_is_the_one_that_held_the_files(idx_run):
    root, data, out = idx_run
    recipe = T.Recipe.from_metadata(ff.checkpoint.read_metadata(out / "last.safetensors")
                                    ["recipe"])
    assert recipe.data_dir == str(data.resolve())  # data/mnist, not the data/ given
    assert recipe.train_examples == len(ff.data.digits("train")[0])


def test_resume_on_data_of_another_size_is_refused(idx_run, tmp_path, cli):
    root, data, out = idx_run
    x, y = ff.data.digits("train")
    smaller = idx_folder(tmp_path / "smaller", train_labels=y[:500].astype(np.uint8))
    images = np.round(x[:500] * 255).astype(np.uint8).reshape(-1, 8, 8)
    write_idx(smaller / IDX_NAMES["train"][0], images)
    proc = cli("train", "--resume", out / "last.safetensors", "--data-dir", smaller,
               "--epochs", "2", "--out", tmp_path / "run")
    assert_one_line_error(proc, f"trained on {len(x)} examples per epoch",
                          "the data now has 500", "Fix: --data-dir with the data it was "
                          "trained on")
    assert not (tmp_path / "run").exists()


def test_resuming_a_finished_run_says_there_is_nothing_to_train(idx_run, cli):
    _, _, out = idx_run
    proc = cli("train", "--resume", out / "last.safetensors", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "has trained all 1 epoch of its run: nothing to train" in proc.stdout
    assert "Fix: --epochs 2 or more" in proc.stdout
    assert "resuming" not in proc.stdout and "1 epoch of" in proc.stdout  # not "1 epochs"


def test_no_schedule_note_before_the_error_it_contradicts(tmp_path, cli):
    out = tmp_path / "run"
    assert cli("train", *DIGITS, "--epochs", "2", "--out", out).returncode == 0
    proc = cli("train", "--resume", out / "last.safetensors", "--epochs", "1")
    assert_one_line_error(proc, "has already trained 2 epochs, more than --epochs 1")
    assert "note:" not in proc.stdout


def test_dataset_conflict_names_the_folder_not_an_internal_name(idx_run, cli):
    _, data, out = idx_run
    proc = cli("train", "--resume", out / "last.safetensors", "--dataset", "digits")
    assert_one_line_error(proc, f"--dataset digits (the checkpoint's run trained on "
                                f"--data-dir {data.resolve()})")
    assert "has idx" not in proc.stderr


@pytest.mark.parametrize("seed", ["-1", str(2 ** 64)])
def test_seeds_outside_64_bits_are_refused(seed, tmp_path, capsys):
    from fuseflow.cli import main

    with pytest.raises(SystemExit) as info:
        main(["train", *DIGITS, "--seed", seed, "--out", str(tmp_path / "o")])
    assert info.value.code == 2
    assert f"--seed: expected an int in [0, 2**64), got '{seed}'" in capsys.readouterr().err


def test_random_key_refuses_seeds_that_would_wrap():
    assert not np.array_equal(ff.random.key(2 ** 64 - 1), ff.random.key(0))
    np.testing.assert_array_equal(ff.random.key(-1), ff.random.key(2 ** 64 - 1))  # as JAX
    with pytest.raises(ValueError, match="does not fit in 64 bits"):
        ff.random.key(2 ** 64)


def test_make_step_refuses_swapped_arguments_at_once():
    model = nn.Serial(nn.Dense(8, "relu"), nn.Dense(3))
    opt, loss = ff.optim.sgd(0.1), ff.losses.softmax_cross_entropy
    with pytest.raises(TypeError, match=r"loss_fn must be .* got GradientTransformation.*"
                                        r"make_step\(model, loss_fn, optimizer\)"):
        T.make_step(model, opt, loss)
    with pytest.raises(TypeError, match="model must be a layer"):
        T.make_step(loss, model, opt)
    with pytest.raises(TypeError, match="optimizer must have init and update"):
        T.make_step(model, loss, "adam")

    class DuckSGD:  # any object with init and update is an optimizer, as in update_and_apply
        init, update = opt.init, opt.update

    T.make_step(model, loss, DuckSGD())


def test_fit_names_the_data_shape_the_user_passed(rng):
    model = nn.Serial(nn.Dense(8, "relu"), nn.Dense(3))
    opt = ff.optim.sgd(0.1)
    state = T.init_state(model, opt, 16, ff.random.key(0))  # an int in_shape is (16,)
    x = rng.standard_normal((40, 4, 4)).astype(np.float32)
    y = rng.integers(0, 3, 40)
    with pytest.raises(ValueError, match=r"fit: train: x has shape \(40, 4, 4\); on its "
                                         r"first example, x\[:1\]"):
        T.fit(model, opt, state, (x, y), epochs=1, batch_size=8, progress=False, log=None)


def test_fit_out_dir_that_is_a_file_is_refused_before_training(rng, tmp_path):
    model = nn.Serial(nn.Dense(3))
    opt = ff.optim.sgd(0.1)
    state = T.init_state(model, opt, (4,), ff.random.key(0))
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    x, y = rng.standard_normal((16, 4)).astype(np.float32), rng.integers(0, 3, 16)
    with pytest.raises(NotADirectoryError, match="out_dir .*afile is a file.*Fix:"):
        T.fit(model, opt, state, (x, y), epochs=1, batch_size=8, out_dir=afile,
              progress=False, log=None)
    assert afile.read_text() == "keep me"


def test_mlp_takes_one_int_for_one_hidden_layer():
    assert [layer.features for layer in T.mlp(32, 10).layers] == [32, 10]


def test_read_metrics_takes_the_run_folder(idx_run):
    _, _, out = idx_run
    assert T.read_metrics(out) == T.read_metrics(out / T.METRICS_FILE) != []


def test_a_checkpoint_of_another_optimizer_is_named_as_such(tmp_path):
    model = T.mlp(16, 10)
    path = tmp_path / "adam.safetensors"
    T.save_state(path, T.init_state(model, ff.optim.adam(1e-3), (64,), ff.random.key(0)))
    with pytest.raises(ff.checkpoint.CheckpointError,
                       match="(?s)Every difference is in the optimizer state.*params match"):
        T.load_state(path, like=T.init_state(model, ff.optim.sgd(0.1), (64,), ff.random.key(0)))
    with pytest.raises(ff.checkpoint.CheckpointError) as info:  # another model: no such line
        T.load_state(path, like=T.init_state(T.mlp(32, 10), ff.optim.adam(1e-3), (64,),
                                             ff.random.key(0)))
    assert "optimizer state" not in str(info.value)


def test_an_old_optimizer_state_after_a_model_change_says_init_again():
    opt = ff.optim.adam(1e-3)
    _, old = nn.Serial(nn.Dense(16)).init(ff.random.key(0), (8,))
    _, new = nn.Serial(nn.Dense(32)).init(ff.random.key(0), (8,))
    with pytest.raises(ValueError, match=r"opt.init\(new_params\)"):
        ff.optim.update_and_apply(opt, new, opt.init(old), new)


def test_the_optimizer_hint_needs_a_difference_in_the_optimizer_state(tmp_path):
    model = T.mlp(16, 10)
    state = T.init_state(model, ff.optim.adam(1e-3), (64,), ff.random.key(0))
    path = tmp_path / "adam.safetensors"
    T.save_state(path, state)
    wider = state._replace(params=ff.tree.astype(state.params, np.float64))  # params differ
    with pytest.raises(ff.checkpoint.CheckpointError) as info:
        T.load_state(path, like=wider)
    assert "optimizer state" not in str(info.value)
    damaged = bytearray(path.read_bytes())
    damaged[-5] ^= 0xFF  # a byte of the last tensor: the CRC check fails, nothing "differs"
    (tmp_path / "bad.safetensors").write_bytes(bytes(damaged))
    with pytest.raises(ff.checkpoint.CheckpointError) as info:
        T.load_state(tmp_path / "bad.safetensors", like=state)
    assert "optimizer state" not in str(info.value)


def test_splits_in_two_folders_record_the_folder_given(tmp_path, cli):
    data = idx_folder(tmp_path / "data" / "mnist")
    for name in IDX_NAMES["test"]:  # the test split beside mnist/, the train split inside
        (data / name).rename(tmp_path / "data" / name)
    out = tmp_path / "run"
    assert cli("train", "--data-dir", tmp_path / "data", "--epochs", "1", "--out", out,
               *SMALL).returncode == 0
    recipe = T.Recipe.from_metadata(ff.checkpoint.read_metadata(out / "last.safetensors")
                                    ["recipe"])
    assert recipe.data_dir == str((tmp_path / "data").resolve())
    assert cli("eval", out / "last.safetensors").returncode == 0
