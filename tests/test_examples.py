"""Every numbered example runs, as a user would run it, and says what it should.

Examples are what users copy, so a broken one is a bug. Each runs in a fresh interpreter
from a folder outside the repository (so it uses the installed fuseflow, not a path hack).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name, *args, cwd, env=None, timeout=300):
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], cwd=cwd,
                          env=dict(os.environ, MPLBACKEND="Agg", **(env or {})),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{name} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _test_accuracy(stdout):
    m = re.search(r"test[ _]accuracy[ =](\d\.\d{4})", stdout)
    assert m, stdout
    return float(m.group(1))


def test_every_example_is_tested():
    tested = {"01_mlp_functions.py", "02_custom_layer.py", "03_mnist.py"}
    assert {p.name for p in EXAMPLES.glob("[0-9][0-9]_*.py")} == tested


def test_01_mlp_functions(tmp_path):
    out = run_example("01_mlp_functions.py", cwd=tmp_path)
    losses = [float(v) for v in re.findall(r"epoch \d+: loss (\S+)", out)]
    assert len(losses) == 10 and losses[-1] < losses[0]
    assert _test_accuracy(out) > 0.9


def test_02_custom_layer(tmp_path):
    out = run_example("02_custom_layer.py", cwd=tmp_path)
    assert out.startswith("check_grads: checked")
    assert "learned beta" in out
    assert _test_accuracy(out) > 0.9


def test_03_mnist_on_digits_without_mnist(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = run_example("03_mnist.py", "--epochs", "1", "--out", tmp_path / "run", cwd=tmp_path,
                      env={"FUSEFLOW_DATA": str(empty), "XDG_CACHE_HOME": str(empty)})
    assert "using scikit-learn's digits" in out
    assert (tmp_path / "run" / "last.safetensors").is_file()
    assert _test_accuracy(out) > 0.5


def test_03_mnist_with_a_data_dir_without_mnist_is_an_error(tmp_path):
    """A folder the user named is the only place looked: no silent switch to digits."""
    proc = subprocess.run([sys.executable, str(EXAMPLES / "03_mnist.py"), "--data-dir",
                           str(tmp_path), "--epochs", "1"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, MPLBACKEND="Agg"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "error: MNIST (train split) not found" in proc.stderr and str(tmp_path) in proc.stderr
    assert "digits" not in proc.stdout and "Traceback" not in proc.stderr


def test_03_mnist_one_epoch(mnist_dir, tmp_path):
    out = run_example("03_mnist.py", "--data-dir", mnist_dir, "--epochs", "1", cwd=tmp_path)
    assert out.startswith("data: MNIST")
    assert _test_accuracy(out) >= 0.95
