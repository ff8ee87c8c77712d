"""The statistics the benchmark reports rest on (benchmarks/peers.py, benchmarks/report.py).

docs/benchmarks.md quotes time-to-98% medians over seeds; a seed that never reaches 98%
must count as the slowest, not void the median nor be dropped (dropping it would flatter
the framework that failed).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name):
    sys.path.insert(0, str(BENCH))  # peers.py imports its sibling _meta
    try:
        spec = importlib.util.spec_from_file_location(f"ff_bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


peers, report = _load("peers"), _load("report")


def _run(t):
    epochs = [{"epoch": 1, "test_accuracy": 0.99 if t is not None else 0.97, "train_s": 1.0}]
    return {"epochs": epochs, "reached_98": t is not None, "time_to_98_s": t}


def test_median_over_seeds_that_all_reached():
    rec = peers.over_seeds([_run(t) for t in (0.3, 0.1, 0.2, 0.5, 0.4)], "r", 1.5)
    assert rec["time_to_98_s"] == pytest.approx(0.3)
    assert rec["reached_98"] and rec["seeds_reached_98"] == 5
    assert report.median_time(rec) == pytest.approx(0.3)


def test_a_seed_that_never_reached_counts_as_slowest():
    runs = [_run(t) for t in (0.1, None, 0.2, 0.4)]
    rec = peers.over_seeds(runs, "r", 0.0)
    # sorted: 0.1, 0.2, 0.4, inf -> the median of four is (0.2 + 0.4) / 2
    assert rec["time_to_98_s"] == pytest.approx(0.3)
    assert not rec["reached_98"] and rec["seeds_reached_98"] == 3
    assert rec["epochs_to_98_each"] == [1, None, 1, 1]
    assert report.median_time(rec) == pytest.approx(0.3)


def test_median_is_none_when_unfinished_seeds_decide_it():
    rec = peers.over_seeds([_run(t) for t in (0.1, None, None)], "r", 0.0)
    assert rec["time_to_98_s"] is None
    assert math.isinf(report.median_time(rec))


def test_report_reads_records_written_before_the_rule():
    # call 31's JAX record: one seed unfinished, time_to_98_s left None by the old rule
    old = {"time_to_98_s": None, "time_to_98_each_s": [0.2, None, 0.13, 0.13, 0.1]}
    assert report.median_time(old) == pytest.approx(0.13)
    assert report.median_time({"time_to_98_s": 0.188}) == pytest.approx(0.188)


def test_settings_ab_parses_each_arm_into_typed_attributes():
    """``--setting`` arms of benchmarks/settings_ab.py: Python literals where they parse
    (``0`` is the number, not the string "0"), anything else as a string."""
    ab = _load("settings_ab")
    assert ab.parse_setting("overlap_streams=2,split_update=auto,tf32=False") == \
        {"overlap_streams": 2, "split_update": "auto", "tf32": False}
    assert ab.parse_setting("overlap_max_bytes=262144, overlap_order=early") == \
        {"overlap_max_bytes": 262144, "overlap_order": "early"}
    with pytest.raises(SystemExit, match="attribute=value"):
        ab.parse_setting("overlap_streams")


def test_settings_ab_resolves_backend_attributes_and_module_constants():
    ab = _load("settings_ab")
    from fuseflow.backend import epilogs

    be = object()
    assert ab.resolve(be, "overlap_streams") == (be, "overlap_streams")
    assert ab.resolve(be, "epilogs.EPILOGS") == (epilogs, "EPILOGS")


def test_skinny_sweep_picks_the_launch_with_the_least_gradient_time():
    """Weight plus input gradient of one launch shape decides; rows without a shape (the
    SIMT kernels, the older rows-only sweep) and shapes missing a kernel do not count."""
    sweep = _load("skinny_sweep")

    def row(kernel, rpc, warps, unroll, us):
        return {"kernel": kernel, "form": "tc", "rows_per_chunk": rpc, "warps": warps,
                "unroll": unroll, "us": us}

    rows = [{"kernel": "wgrad", "form": "simt", "us": 1.0},
            row("wgrad", 512, 4, 2, 30.0), row("dgrad", 512, 4, 2, 34.0),
            row("wgrad", 256, 8, 4, 25.0), row("dgrad", 256, 8, 4, 36.0),  # 61 < 64
            row("wgrad", 512, 8, 1, 10.0)]  # no dgrad: not a candidate
    assert sweep.best_tc_launch(rows) == ("_cuda_skinny_tc.ROWS_PER_CHUNK=256,"
                                          "_cuda_skinny_tc.GRAD_WARPS=8,"
                                          "_cuda_skinny_tc.GRAD_UNROLL=4")
    with pytest.raises(SystemExit, match="no tensor-core"):
        sweep.best_tc_launch(rows[:1])


RESULTS = BENCH / "results"


@pytest.mark.parametrize("folder, tag, verdicts", [
    # call 110: medium 0.84x / 0.85x and the 16-bit step at 79.4% of JAX's bf16 matmul miss
    ("session25_s25a", "s25a", [True, False, True, False, True, True, True]),
    # call 102: medium SGD 0.84x misses though Adam's 0.71x meets; the 16-bit step at 78.8%
    ("session22_s22e", "s22e", [True, False, True, False, True, True, True]),
])
def test_report_judges_the_issue_targets_from_a_call_s_files(folder, tag, verdicts):
    """``report.targets`` on the JSON files calls 110 and 102 wrote: the verdicts that
    docs/benchmarks.md states for them, computed from the files themselves."""
    ff, jx = (report.load(RESULTS / folder, f, tag) for f in ("fuseflow", "jax"))
    rows = report.targets(ff, jx)
    assert [met for _, _, met in rows] == verdicts
    measured = dict((name, text) for name, text, _ in rows)
    if tag == "s25a":
        assert measured["784-1024-1024-10, fp32: compiled <= 0.75x JAX jit"] == \
            "sgd 0.84x, adam 0.85x"
        assert measured["16-bit Adam >= 80% of JAX's bf16 matmul"].endswith("= 79.4%")
        assert measured["time to 98% <= 0.75x JAX's"].endswith("= 0.73x")
    else:
        assert measured["784-1024-1024-10, fp32: compiled <= 0.75x JAX jit"] == \
            "sgd 0.84x, adam 0.71x"


def test_report_targets_count_a_ratio_at_its_limit_as_met():
    """The targets are upper (or, for the matmul share, lower) bounds inclusive of the
    limit, and a file without JAX's numbers judges only what fuseflow's file holds."""
    ff = {"steps": [{"model": "784-30-10", "batch": 256, "optimizer": o, "precision": "fp32",
                     "compiled_us": 50.0, "eager_us": 900.0} for o in ("sgd", "adam")],
          "memory": [{"ratio": 1.25}]}
    jx = {"steps": [{"model": "784-30-10", "optimizer": o, "precision": "fp32", "jit_us": 100.0}
                    for o in ("sgd", "adam")]}
    assert [met for _, _, met in report.targets(ff, jx)] == [True, True]
    ff["steps"][1]["compiled_us"] = 50.5
    assert [met for _, _, met in report.targets(ff, jx)] == [False, True]
    assert [name for name, _, _ in report.targets(ff, None)] == [
        "peak memory <= 1.25x what must be alive"]


def test_report_names_the_3xtf32_products_in_the_float32_verdicts():
    """A fuseflow file written with ``fp32_wgmma`` on says so in the fp32 target's name:
    its products ran on the TF32 tensor cores, and the verdict must show it."""
    ff = {"steps": [{"model": "784-1024-1024-10", "batch": 256, "optimizer": "sgd",
                     "precision": "fp32", "compiled_us": 80.0, "eager_us": 900.0}],
          "fp32_wgmma": "3xtf32"}
    jx = {"steps": [{"model": "784-1024-1024-10", "optimizer": "sgd", "precision": "fp32",
                     "jit_us": 120.0}]}
    (name, measured, met), = report.targets(ff, jx)
    assert "3xtf32: TF32 tensor cores" in name and measured == "sgd 0.67x" and met
    ff["fp32_wgmma"] = "off"
    assert report.targets(ff, jx)[0][0] == "784-1024-1024-10, fp32: compiled <= 0.75x JAX jit"


def test_shared_start_is_the_same_numbers_for_both_frameworks():
    # paired time-to-98 runs (--mnist-start shared): each worker calls shared_start itself,
    # so the draw must depend on the seed alone
    (layers, orders), (again, orders_again) = (peers.shared_start(3, 1000) for _ in range(2))
    other, _ = peers.shared_start(4, 1000)
    for (w, b), (w2, b2), (w3, _) in zip(layers, again, other):
        assert w.dtype == np.float32 and (w == w2).all() and (b == b2).all()
        assert not (w == w3).all() and not b.any()
    assert [w.shape for w, _ in layers] == [(784, 1024), (1024, 1024), (1024, 10)]
    # He normal: std sqrt(2 / fan_in)
    assert layers[0][0].std() == pytest.approx(np.sqrt(2 / 784), rel=0.01)
    assert len(orders) == peers.MAX_EPOCHS
    for o, o2 in zip(orders, orders_again):
        assert (o == o2).all() and len(o) == 768 and len(np.unique(o)) == 768
        assert o.min() >= 0 and o.max() < 1000
    assert not (orders[0] == orders[1]).all()


def test_shared_start_means_one_model_on_both_layouts():
    # JAX's weights are (in, out), fuseflow's Dense keeps (out, in): the fuseflow worker
    # transposes them, and the two must compute the same function
    import fuseflow as ff

    layers, _ = peers.shared_start(0, 256, sizes=(784, 32, 16, 10))
    x = np.random.default_rng(1).random((5, 784), dtype=np.float32)
    h = x
    for i, (w, b) in enumerate(layers):
        h = h @ w + b
        h = np.maximum(h, 0) if i < len(layers) - 1 else h
    model = ff.nn.Serial(ff.nn.Dense(32, "relu"), ff.nn.Dense(16, "relu"), ff.nn.Dense(10))
    params = tuple({"w": np.ascontiguousarray(w.T), "b": b} for w, b in layers)
    np.testing.assert_allclose(model.apply(params, x), h, rtol=1e-5, atol=1e-6)


def test_epoch_ms_is_the_median_epoch_over_every_seed():
    def run(*cumulative):
        return {"epochs": [{"epoch": i + 1, "test_accuracy": 0.99, "train_s": t}
                           for i, t in enumerate(cumulative)]}
    record = {"seeds": [run(0.030, 0.060, 0.091), run(0.029, 0.062)],
              "epochs": run(0.030)["epochs"]}
    # epochs 30, 30, 31, 29, 33 ms -> 30
    assert report.epoch_ms(record) == pytest.approx(30.0)
    # a file from before per-seed runs: its one run's epochs
    assert report.epoch_ms({"epochs": run(0.010, 0.030)["epochs"]}) == pytest.approx(15.0)


@pytest.mark.parametrize("precision, hand_row, scaling, label", [
    ("fp32", False, None, "fp32"),
    ("tf32", True, None, "tf32"),
    ("fp16", False, "dynamic", "16-bit (fuseflow fp16; JAX, torch bf16)"),
    ("fp16", False, "none", "16-bit (fuseflow fp16; JAX, torch bf16, no loss scaling)"),
    ("bf16", False, None, "16-bit (bf16)"),
    ("bf16", True, None, "16-bit (bf16; hand nvmath fp16)"),
    ("bf16", False, "none", "16-bit (bf16, no loss scaling)"),
    ("bf16", True, "none", "16-bit (bf16; hand nvmath fp16, no loss scaling)"),
])
def test_precision_labels_name_what_each_side_ran(precision, hand_row, scaling, label):
    # the labels docs/benchmarks.md's tables carry, as report.py wrote them before
    assert report.precision_label(precision, hand_row, scaling) == label


def test_k_steps_in_one_compiled_call_give_the_one_step_losses():
    """multistep_probe.py's k-step function, compiled (a checked pass-through on NumPy),
    gives the losses and params of k calls of the one step, over fresh random batches."""
    import fuseflow as ff
    from tests.test_compile import make_problem

    k_steps = _load("multistep_probe").k_steps
    params, state, step, xs, ys = make_problem(sizes=(20, 32, 10), batch=16, seed=3,
                                               optimizer=ff.optim.adam(1e-2))
    p_k, _, metrics = ff.compile(k_steps(step, 3))(params, state, xs[:3], ys[:3])
    p, s, want = params, state, []
    for i in range(3):
        p, s, m = step(p, s, xs[i], ys[i])
        want.append(float(m["loss"]))
    assert [float(m["loss"]) for m in metrics] == want and want[0] != want[2]
    for a, b in zip(ff.tree.leaves(p_k), ff.tree.leaves(p)):
        np.testing.assert_array_equal(a, b)


def test_gelu_peers_are_one_model_on_both_sides(monkeypatch):
    # --activation gelu: fuseflow's Dense(h, "gelu") and the JAX worker's jax.nn.gelu (its
    # tanh form) must be the same loss of the same params
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import optax

    import fuseflow as ff

    monkeypatch.setattr(peers, "ACTIVATION", ["gelu"])
    layers, _ = peers.shared_start(0, 256, sizes=(784, 32, 16, 10))
    layers = [(w, np.random.default_rng(i).standard_normal(w.shape[1]).astype(np.float32))
              for i, (w, _) in enumerate(layers)]
    x = np.random.default_rng(1).random((5, 784), dtype=np.float32)
    y = np.array([3, 1, 4, 1, 5])
    def jax_loss():
        with jax.default_matmul_precision("highest"):
            return float(peers.jax_loss(jax, jnp, optax, jnp.float32)(
                [(jnp.asarray(w), jnp.asarray(b)) for w, b in layers], jnp.asarray(x),
                jnp.asarray(y)))

    model = ff.nn.Serial(ff.nn.Dense(32, "gelu"), ff.nn.Dense(16, "gelu"), ff.nn.Dense(10))
    params = tuple({"w": np.ascontiguousarray(w.T), "b": b} for w, b in layers)
    want = float(ff.losses.softmax_cross_entropy(model.apply(params, x), y)[0])  # (value, grad)
    np.testing.assert_allclose(jax_loss(), want, rtol=1e-5)
    monkeypatch.setattr(peers, "ACTIVATION", ["relu"])  # the switch is what made them agree
    assert abs(jax_loss() - want) > 1e-3


# ---- interleaved_16bit.py: the step's share of the matmul rate, paired by round ----------
interleaved = _load("interleaved_16bit")


def _window(item, rnd, burst_tflops, sustained_tflops):
    return {"item": item, "round": rnd, "burst_tflops": burst_tflops,
            "sustained_tflops": sustained_tflops, "sm_mhz": None, "watts": None}


def test_step_share_pairs_each_round_with_its_own_reference():
    rows = [_window("fuseflow_step", 0, 600.0, 610.0), _window("ref", 0, 800.0, 750.0),
            _window("fuseflow_step", 1, 620.0, 600.0), _window("ref", 1, 700.0, 760.0)]
    share = interleaved.summarize(rows)["step_share"]["ref"]
    # round 0: 600/800 and 610/750; round 1: 620/700 and 600/760 (never 600/700 etc.)
    assert share["burst"]["each"] == pytest.approx([0.75, 620 / 700])
    assert share["sustained"]["each"] == pytest.approx([610 / 750, 600 / 760])
    assert share["burst"]["min"] == pytest.approx(0.75)
    assert share["sustained"]["median"] == pytest.approx((610 / 750 + 600 / 760) / 2)


def test_windows_take_turns_and_rotate_their_order():
    calls = []
    items = {name: (lambda name=name: calls.append(name), lambda: None, 1e6)
             for name in ("a", "b", "c")}
    rows = interleaved.run_windows(items, rounds=3, window=0.0, gap=0.0, settle=0.0, block=1)
    order = [r["item"] for r in rows]
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert all(r["sustained_tflops"] > 0 and len(r["blocks"]) >= 2 for r in rows)


def test_clock_samples_are_parsed_and_averaged_over_the_settled_part():
    text = ("2026/12/07 11:30:00.000, 1980, 300.5, 40\n"
            "2026/12/07 11:30:00.500, 1755, 690.0, 52\n"
            "not a sample\n"
            "2026/12/07 11:30:01.000, 1700, 700.0, 54\n")
    samples = interleaved.parse_samples(text)
    assert [s[1:] for s in samples] == [(1980.0, 300.5, 40.0), (1755.0, 690.0, 52.0),
                                        (1700.0, 700.0, 54.0)]
    t0 = samples[0][0]
    row = {"start_unix": t0, "end_unix": t0 + 1.0}
    interleaved.attach_clocks([row], samples, settle=0.25)  # the first sample is too early
    assert row["samples"] == 2
    assert row["sm_mhz"] == pytest.approx(1727.5) and row["watts"] == pytest.approx(695.0)


def test_pooling_keeps_every_round_pairing_of_every_process():
    rows_a = [_window("fuseflow_step", 0, 600.0, 590.0), _window("ref", 0, 800.0, 740.0),
              _window("fuseflow_step", 1, 602.0, 588.0), _window("ref", 1, 820.0, 730.0)]
    rows_b = [_window("fuseflow_step", 0, 598.0, 592.0), _window("ref", 0, 790.0, 720.0)]
    pooled = interleaved.pool([interleaved.summarize(rows_a), interleaved.summarize(rows_b)])
    sustained = pooled["step_share"]["ref"]["sustained"]
    ratios = [590 / 740, 588 / 730, 592 / 720]
    assert sustained["count"] == 3
    assert sustained["median"] == pytest.approx(sorted(ratios)[1])
    assert sustained["min"] == pytest.approx(min(ratios))
    assert sustained["max"] == pytest.approx(max(ratios))
    # each process's item median is one value: process a's two rounds, then process b's
    assert pooled["items"]["ref"]["burst"] == pytest.approx([810.0, 790.0])


def test_pooling_the_calls_212_and_213_files():
    """The four processes of calls 212-213 (an H100): the numbers docs/benchmarks.md quotes."""
    results = BENCH / "results"
    paths = sorted(results.glob("session53_call21[23]/interleaved_16bit_s53*.json"))
    assert len(paths) == 4
    share = interleaved.print_pooled(paths)["step_share"]
    assert share["jax_bf16_uniform"]["sustained"]["count"] == 12
    assert share["jax_bf16_uniform"]["sustained"]["median"] == pytest.approx(0.799, abs=5e-4)
    assert share["jax_bf16_uniform"]["burst"]["median"] == pytest.approx(0.734, abs=5e-4)
    assert share["jax_step"]["sustained"]["min"] > 1.15
