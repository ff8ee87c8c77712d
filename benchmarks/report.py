"""Markdown from the peers JSON files (fuseflow, JAX, torch, hand nvmath) of one call.

    python benchmarks/report.py DIR [--tag TAG] [--prefix PREFIX] > table.md

Reads ``DIR/[PREFIX]peers_<framework>[_TAG].json`` (e.g. ``--prefix session9_ --tag s9e``
for the files a session copied into benchmarks/results) and prints the step table (us per step; the
last column is fuseflow compiled over JAX jit), then, where the files have them, the 16-bit
Adam step's share of every plain-matmul reference of the call, the time-to-98% medians, and
the compiled-step issue's targets, each met or not in this call (the verdict docs/benchmarks.md
tabulates).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import median_over_seeds  # noqa: E402

FRAMEWORKS = ("fuseflow", "jax", "torch", "hand_nvmath")
#: The compiled-step issue's targets: fuseflow's compiled step over JAX's jitted one, full
#: float32, SGD and Adam, per model; the 16-bit Adam step's share of JAX's bf16 8192^3
#: matmul with uniform operands (the issue's reference) and its ratio to JAX's bf16 step;
#: time to 98% MNIST test accuracy over JAX's; peak memory over what must be alive.
STEP_TARGETS = {"784-30-10": 0.5, "784-1024-1024-10": 0.75, "784-4096-4096-10": 1.0}
MATMUL_SHARE_TARGET = 0.80
#: fuseflow's 16-bit rows: float16 (loss-scaled) or bfloat16 (peers.py --fuseflow-16bit)
LOW = ("fp16", "bf16")
TIME_TO_98_TARGET = 0.75
MEMORY_TARGET = 1.25


def file_name(framework, tag="", prefix=""):
    return f"{prefix}peers_{framework}{'_' + tag if tag else ''}.json"


def load(folder, framework, tag="", prefix=""):
    p = Path(folder) / file_name(framework, tag, prefix)
    return json.loads(p.read_text()) if p.exists() else None


def key(r):
    return r["model"], r["optimizer"], r["precision"]


def fmt(v):
    return f"{v:,.0f}" if v is not None else "-"


def step_table(ff, jx, th, hand):
    jax_us = {key(r): r["jit_us"] for r in jx["steps"]} if jx else {}
    torch_us = {(key(r), r["mode"]): r["us"] for r in th["steps"]} if th else {}
    hand_us = {key(r): (r["eager_us"], r["graph_us"]) for r in hand["steps"]} if hand else {}
    print("| model, batch | opt | precision | fuseflow eager | fuseflow compiled | hand nvmath "
          "eager / graph | JAX jit | torch eager | torch.compile / reduce-overhead | "
          "compiled / JAX |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in ff["steps"]:
        k = key(r)
        low = k[2] == "fp16"
        jk = (k[0], k[1], "bf16") if low else k  # JAX and torch run bfloat16 there (as
        # fuseflow does with peers.py --fuseflow-16bit bf16)
        # the hand-written nvmath pattern runs its 16-bit step in float16 only
        hk = (k[0], k[1], "fp16") if k[2] == "bf16" else k
        j, h = jax_us.get(jk), hand_us.get(hk)
        tc = [torch_us.get((jk, m)) for m in ("eager", "default", "reduce-overhead")]
        precision = precision_label(k[2], h is not None, r.get("loss_scaling"))
        ratio = f"{r['compiled_us'] / j:.2f}x" if j else "-"
        print(f"| {k[0]}, {r['batch']} | {k[1]} | {precision} | {fmt(r['eager_us'])} "
              f"| **{fmt(r['compiled_us'])}** | {fmt(h[0]) + ' / ' + fmt(h[1]) if h else '-'} "
              f"| {fmt(j)} | {fmt(tc[0])} | {fmt(tc[1])} / {fmt(tc[2])} | {ratio} |")


def precision_label(precision, hand_row, loss_scaling=None):
    """The step table's precision cell. A 16-bit row says what each side ran: fuseflow's
    float16 against JAX's and torch's bfloat16, or bfloat16 everywhere (the hand-written
    nvmath pattern's row beside it is float16, ``hand_row``), and "no loss scaling" for
    ``compute_copy`` rows (peers.py runs bfloat16 so from call 149 on)."""
    if precision == "fp16":
        notes = ["fuseflow fp16", "JAX, torch bf16"]
    elif precision == "bf16":
        notes = ["bf16", "hand nvmath fp16"] if hand_row else ["bf16"]
    else:
        return precision
    inner = "; ".join(notes) + (", no loss scaling" if loss_scaling == "none" else "")
    return f"16-bit ({inner})"


def low_adam_step(ff):
    """fuseflow's 16-bit Adam row of a call (the 80% target's step), or None."""
    return next((r for r in ff["steps"] if r["precision"] in LOW and r["optimizer"] == "adam"),
                None)


def references(ff, jx):
    """The 16-bit Adam step's TFLOP/s against each plain-matmul reference of the call."""
    step = low_adam_step(ff)
    if step is None:
        return
    each = ff.get("matmul_rate_each_tflops") or {"uniform": ff["matmul_rate_tflops"]}
    if isinstance(each, list):  # the sixth session's call 29: uniform operands, before/after
        each = dict(zip(("before_uniform", "after_uniform"), each))
    refs = {f"cupy_fp16_{k}": v for k, v in each.items()}
    if jx and isinstance(jx.get("matmul_rate_tflops"), dict):
        refs.update({f"jax_{k}": v for k, v in jx["matmul_rate_tflops"].items()})
    print(f"\n16-bit Adam step: {step['tflops_compiled']:.1f} TFLOP/s")
    for name, rate in refs.items():
        print(f"- {name}: {rate:.0f} TFLOP/s, the step at {step['tflops_compiled'] / rate:.1%}")


def time_to_98(ff, jx):
    for k in ("mnist", "mnist_tf32", "mnist_tf32x3"):
        a, b = (ff or {}).get(k), (jx or {}).get(k)
        if not a and not b:
            continue
        start = (a or b).get("start", "independent")
        print(f"\ntime to 98% ({k}, {start} start):")
        medians, epochs = {}, {}
        for name, m in (("fuseflow", a), ("JAX", b)):
            if m:
                medians[name], epochs[name] = median_time(m), epoch_ms(m)
                print(f"- {name}: median {medians[name]:.3f} s, epochs "
                      f"{m.get('epochs_to_98_each')}, {epochs[name]:.1f} ms an epoch "
                      f"(median), one-time {m['compile_s']:.3f} s")
        if len(medians) == 2:
            print(f"- ratio {medians['fuseflow'] / medians['JAX']:.2f}x; per epoch "
                  f"{epochs['fuseflow'] / epochs['JAX']:.2f}x")


def targets(ff, jx):
    """``(target, measured, met)`` for each target of the compiled-step issue that this
    call's files measure (the step ratios need JAX's file)."""
    rows = []
    jax_us = {key(r): r["jit_us"] for r in jx["steps"]} if jx else {}
    wgmma = ff.get("fp32_wgmma", "off")
    fp32 = "fp32" if wgmma == "off" else f"fp32 (fuseflow's products {wgmma}: TF32 tensor cores)"
    for model, limit in STEP_TARGETS.items():
        ratios = {r["optimizer"]: r["compiled_us"] / jax_us[key(r)] for r in ff["steps"]
                  if r["model"] == model and r["precision"] == "fp32" and key(r) in jax_us}
        if ratios:
            rows.append((f"{model}, {fp32}: compiled <= {limit}x JAX jit",
                         ", ".join(f"{o} {v:.2f}x" for o, v in ratios.items()),
                         all(v <= limit for v in ratios.values())))
    step = low_adam_step(ff)
    rates = (jx or {}).get("matmul_rate_tflops")
    if step is not None and isinstance(rates, dict) and "bf16_uniform" in rates:
        share = step["tflops_compiled"] / rates["bf16_uniform"]
        rows.append((f"16-bit Adam >= {MATMUL_SHARE_TARGET:.0%} of JAX's bf16 matmul",
                     f"{step['tflops_compiled']:.1f} of {rates['bf16_uniform']:.0f} TFLOP/s "
                     f"= {share:.1%}", share >= MATMUL_SHARE_TARGET))
        bf16 = jax_us.get((step["model"], "adam", "bf16"))
        if bf16:
            rows.append(("16-bit Adam faster than JAX's bf16 step",
                         f"{step['compiled_us']:,.0f} vs {bf16:,.0f} us = "
                         f"{step['compiled_us'] / bf16:.2f}x", step["compiled_us"] < bf16))
    a, b = (ff or {}).get("mnist"), (jx or {}).get("mnist")
    if a and b:
        ratio = median_time(a) / median_time(b)
        label = "" if wgmma == "off" else f" (fuseflow's products {wgmma})"
        rows.append((f"time to 98% <= {TIME_TO_98_TARGET}x JAX's{label}",
                     f"{median_time(a):.3f} vs {median_time(b):.3f} s = {ratio:.2f}x",
                     ratio <= TIME_TO_98_TARGET))
    memory = ff.get("memory") or []
    if memory:
        rows.append((f"peak memory <= {MEMORY_TARGET}x what must be alive",
                     " / ".join(f"{m['ratio']:.2f}x" for m in memory),
                     all(m["ratio"] <= MEMORY_TARGET for m in memory)))
    return rows


def print_targets(ff, jx):
    rows = targets(ff, jx)
    if rows:
        print("\nthe issue's targets in this call:\n| target | this call | met? |\n|---|---|---|")
        for name, measured, met in rows:
            print(f"| {name} | {measured} | {'yes' if met else '**no**'} |")


def epoch_ms(record):
    """The median over every seed's epochs of one epoch's training time, in ms (each
    epoch's time is the difference of the cumulative ``train_s``)."""
    times = []
    for run in record.get("seeds") or [{"epochs": record["epochs"]}]:
        done = [0.0] + [e["train_s"] for e in run["epochs"]]
        times += [1e3 * (t1 - t0) for t0, t1 in zip(done, done[1:])]
    return statistics.median(times)


def median_time(record):
    """``peers.median_over_seeds`` of a record's seeds, recomputed: files written before it
    counted an unfinished seed left the median None."""
    return median_over_seeds(record.get("time_to_98_each_s") or [record["time_to_98_s"]])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default="benchmarks/results")
    ap.add_argument("--tag", default="", help="the JSON files' suffix (peers.py --tag)")
    ap.add_argument("--prefix", default="", help="the JSON files' prefix (e.g. session9_)")
    ap.add_argument("--fuseflow-tag", default=None,
                    help="fuseflow's file's suffix where it differs from the others' (e.g. "
                         "s45b_3xtf32 beside JAX's s45b)")
    args = ap.parse_args()
    ff, jx, th, hand = (load(args.folder, f, args.fuseflow_tag
                             if f == "fuseflow" and args.fuseflow_tag is not None else args.tag,
                             args.prefix) for f in FRAMEWORKS)
    if ff is None:
        raise SystemExit(f"report: no {file_name('fuseflow', args.tag, args.prefix)} in "
                         f"{args.folder}")
    step_table(ff, jx, th, hand)
    references(ff, jx)
    time_to_98(ff, jx)
    print_targets(ff, jx)


if __name__ == "__main__":
    main()
