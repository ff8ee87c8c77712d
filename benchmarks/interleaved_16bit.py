"""The 16-bit step's share of the dense matmul rate, with the reference in the same process.

    python benchmarks/interleaved_16bit.py --out DIR [--rounds 5 --window 2.0 --gap 0.5]
    python benchmarks/interleaved_16bit.py --pool DIR/interleaved_16bit_*.json   # no GPU

``peers.py`` times fuseflow's 16-bit 784-4096-4096-10 Adam step and JAX's bfloat16 8192^3
matmul (the issue's reference) in separate processes, each for a few tens of
milliseconds. Over fifteen processes on an H100 the step moved 1.8% and the reference 13%
(741-841 TFLOP/s), so the verdict "the step reaches 80% of the matmul rate" followed the
reference's process. Here every contender runs in one process, in windows of ``--window``
seconds that take turns round after round (each round starting one item later), each
window after ``--gap`` seconds idle:

- fuseflow's compiled bfloat16 Adam step (``peers.fuseflow_step``, no loss scaling);
- JAX's jitted bfloat16 Adam step (``peers.jax_step``), when JAX imports;
- plain 8192^3 matmuls with operands uniform in [0, 1) and standard normal: JAX's
  bfloat16 (the issue's reference), cuBLASLt's bfloat16 through nvmath, CuPy's float16.

A window is a run of blocks of back-to-back calls, each block timed between two device
synchronizations. It reports its first block (a short burst after idle; ``peers.py``
also times only tens of milliseconds) and the median of its blocks from ``--settle``
seconds on (sustained). nvidia-smi samples the SM clock and the board power every 50 ms,
so each window's rate can be read against its clock. The summary pairs the step with
each reference round by round (the step's TFLOP/s, its matmul FLOPs by
``peers.matmul_flops``, over the reference's, 2 x 8192^3 a call) and gives the median,
min and max over rounds. JSON out, with every block.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX beside CuPy's pool
from _meta import metadata, write_json  # noqa: E402

MODEL = "784-4096-4096-10"
MM = 8192  # the plain matmul's m = n = k (peers.plain_operands, peers.jax_bf16_matmul)


def time_window(call, sync, block, window, settle):
    """Blocks of ``block`` calls for ``window`` seconds: ``[(offset_s, us_per_call)]``,
    each block between two synchronizations; offsets from the window's start."""
    sync()
    start = time.perf_counter()
    blocks = []
    while True:
        t0 = time.perf_counter()
        for _ in range(block):
            call()
        sync()
        t1 = time.perf_counter()
        blocks.append((t0 - start, (t1 - t0) / block * 1e6))
        if t1 - start >= window and len(blocks) >= 2 and blocks[-1][0] >= settle:
            return blocks


def run_windows(items, rounds, window, gap, settle, block):
    """Every item's windows, in turns: round r starts at item r (mod the items), so no
    item always follows the same one. ``items``: ``{name: (call, sync, flops)}``."""
    names = list(items)
    rows = []
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            call, sync, flops = items[name]
            sync()
            time.sleep(gap)
            t_start = time.time()
            blocks = time_window(call, sync, block, window, settle)
            burst_us = blocks[0][1]
            sustained_us = statistics.median(us for off, us in blocks if off >= settle)
            rows.append({"item": name, "round": r, "start_unix": t_start,
                         "end_unix": time.time(), "burst_us": burst_us,
                         "sustained_us": sustained_us,
                         "burst_tflops": flops / burst_us / 1e6,
                         "sustained_tflops": flops / sustained_us / 1e6, "blocks": blocks})
            print(f"round {r} {name:24s} burst {rows[-1]['burst_tflops']:7.1f} "
                  f"sustained {rows[-1]['sustained_tflops']:7.1f} TFLOP/s", flush=True)
    return rows


class ClockSampler:
    """nvidia-smi's SM clock, power and temperature every ``ms`` milliseconds, in the
    background (nothing where nvidia-smi is missing)."""

    FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu"

    def __init__(self, path, ms=50):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.file = open(path, "w")
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", f"--query-gpu={self.FIELDS}", "--format=csv,noheader,nounits",
                 "-lms", str(ms)], stdout=self.file, stderr=subprocess.DEVNULL)
        except OSError:
            self.proc = None

    def stop(self):
        """The samples as ``[(unix_time, sm_mhz, watts, celsius)]``."""
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
        self.file.close()
        return parse_samples(Path(self.path).read_text())


def parse_samples(text):
    """nvidia-smi's csv lines (local time stamps ``YYYY/MM/DD HH:MM:SS.mmm``) as tuples."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((t, float(parts[1]), float(parts[2]), float(parts[3])))
        except ValueError:
            continue
    return out


def attach_clocks(rows, samples, settle):
    """Each row's mean SM clock, power and temperature over its settled part."""
    for row in rows:
        inside = [s for s in samples
                  if row["start_unix"] + settle <= s[0] <= row["end_unix"]]
        row["samples"] = len(inside)
        for key, k in (("sm_mhz", 1), ("watts", 2), ("celsius", 3)):
            row[key] = statistics.mean(s[k] for s in inside) if inside else None


def summarize(rows, step="fuseflow_step"):
    """Per reference: the step's TFLOP/s over the reference's, paired by round, burst and
    sustained, as median/min/max over rounds; and each item's medians."""
    by = {}
    for row in rows:
        by.setdefault(row["item"], {})[row["round"]] = row
    out = {"items": {}, "step_share": {}}
    for name, per_round in by.items():
        out["items"][name] = {
            kind: statistics.median(r[f"{kind}_tflops"] for r in per_round.values())
            for kind in ("burst", "sustained")}
        out["items"][name]["sm_mhz"] = _median_or_none(r["sm_mhz"] for r in per_round.values())
        out["items"][name]["watts"] = _median_or_none(r["watts"] for r in per_round.values())
    if step not in by:
        return out
    for ref, per_round in by.items():
        if ref == step:
            continue
        share = {}
        for kind in ("burst", "sustained"):
            ratios = [by[step][r][f"{kind}_tflops"] / per_round[r][f"{kind}_tflops"]
                      for r in sorted(per_round) if r in by[step]]
            share[kind] = {**_spread(ratios), "each": ratios}
        out["step_share"][ref] = share
    return out


def pool(summaries):
    """Several processes' summaries as one: every round's pairing of the step with each
    reference (``each``) pooled, as median/min/max/count; and each item's TFLOP/s and SM
    clock medians per process (a process's median is one value here, not its rounds)."""
    shares, items = {}, {}
    for summary in summaries:
        for ref, share in summary["step_share"].items():
            for kind in ("burst", "sustained"):
                shares.setdefault(ref, {}).setdefault(kind, []).extend(share[kind]["each"])
        for name, item in summary["items"].items():
            for field, value in item.items():
                items.setdefault(name, {}).setdefault(field, []).append(value)
    return {"step_share": {ref: {kind: {**_spread(v), "count": len(v)}
                                 for kind, v in by_kind.items()}
                           for ref, by_kind in shares.items()},
            "items": items}


def print_pooled(paths):
    """``--pool``: the pooled pairings of the JSON files at ``paths``."""
    pooled = pool([json.loads(Path(p).read_text())["summary"] for p in paths])
    for name, item in pooled["items"].items():
        print(f"{name:24s} burst {_span(item['burst'], '.1f')}  sustained "
              f"{_span(item['sustained'], '.1f')} TFLOP/s  SM {_span(item['sm_mhz'], '.0f')} MHz")
    for ref, share in pooled["step_share"].items():
        print(f"step / {ref:22s} " + "  ".join(
            f"{kind} {s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f}, {s['count']})"
            for kind, s in share.items()))
    return pooled


def _spread(values):
    """Median, min and max of ``values`` (a list)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _span(values, spec):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return format(lo, spec) if lo == hi else f"{format(lo, spec)}-{format(hi, spec)}"


def _median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def build_items(args):
    """The contenders: ``{name: (call, sync, flops)}``."""
    import cupy as cp

    import fuseflow as ff
    import peers

    items = {}
    sizes, batch = peers.MODELS[MODEL]
    step_flops = peers.matmul_flops(sizes, batch)
    dev_sync = cp.cuda.Device().synchronize

    # fuseflow: the compiled bfloat16 Adam step, as peers.py's worker builds it
    _, params, state, step, x, y = peers.fuseflow_step(ff, cp, sizes, batch, "adam", "bf16")
    compiled = ff.compile(step, cast_args=peers.fuseflow_casts("bf16"))
    st = {"p": params, "s": state}

    def ff_call():
        st["p"], st["s"], _ = compiled(st["p"], st["s"], x, y)

    for _ in range(5):
        ff_call()
    items["fuseflow_step"] = (ff_call, dev_sync, step_flops)

    mm_flops = 2 * MM ** 3
    rng = cp.random.default_rng(0)

    def cublaslt_bf16(dist):
        """cuBLASLt's bfloat16 through nvmath (a planned stateful Matmul; execute is
        asynchronous)."""
        from nvmath.linalg.advanced import Matmul

        from fuseflow._dtypes import bfloat16
        mm = Matmul(*peers.plain_operands(cp, rng, dist, bfloat16))
        mm.plan()
        mm.execute()
        return lambda: mm.execute()

    def cupy_fp16(dist):
        """CuPy's float16 (cuBLAS), peers.plain_matmul_rates' reference."""
        a, b = peers.plain_operands(cp, rng, dist, cp.float16)
        a @ b
        return lambda: a @ b

    for name, build in (("cublaslt_bf16", cublaslt_bf16), ("cupy_fp16", cupy_fp16)):
        for dist in ("uniform", "normal"):
            try:  # a reference that fails to build is left out, not the whole run
                items[f"{name}_{dist}"] = (build(dist), dev_sync, mm_flops)
            except Exception as exc:  # noqa: BLE001
                print(f"{name}_{dist} left out: {type(exc).__name__}: {exc}", flush=True)

    if args.no_jax:
        return items
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as exc:
        print(f"JAX not importable ({exc}): its items are left out", flush=True)
        return items
    precision = peers.JAX_PRECISION["bf16"]  # part of jit's cache key: every call under it
    with jax.default_matmul_precision(precision):
        jstep, (jp, js, jx, jy) = peers.jax_step(sizes, batch, "adam", "bf16")
    jst = {"p": jp, "s": js, "l": None}

    def jax_call():
        with jax.default_matmul_precision(precision):
            jst["p"], jst["s"], jst["l"] = jstep(jst["p"], jst["s"], jx, jy)

    for _ in range(3):
        jax_call()
    items["jax_step"] = (jax_call, lambda: jst["l"].block_until_ready(), step_flops)
    mmj = jax.jit(lambda a, b: a @ b)
    for dist in ("uniform", "normal"):
        items[f"jax_bf16_{dist}"] = (*peers.jax_bf16_matmul(jax, jnp, mmj, dist), mm_flops)
    return items


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="the folder for the JSON and the clock samples")
    ap.add_argument("--pool", nargs="+", metavar="JSON",
                    help="no GPU: pool the round-by-round pairings of these files (several "
                         "processes) and print them")
    ap.add_argument("--tag", default="")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=float, default=2.0, help="seconds per window")
    ap.add_argument("--gap", type=float, default=0.5, help="seconds idle before a window")
    ap.add_argument("--settle", type=float, default=0.5,
                    help="seconds into a window before its blocks count as sustained")
    ap.add_argument("--block", type=int, default=10, help="calls per timed block")
    ap.add_argument("--no-jax", action="store_true")
    args = ap.parse_args()
    if args.pool:
        print_pooled(args.pool)
        return
    if not args.out:
        ap.error("--out is required (or --pool FILES)")

    items = build_items(args)
    suffix = f"_{args.tag}" if args.tag else ""
    sampler = ClockSampler(os.path.join(args.out, f"interleaved_16bit_clocks{suffix}.csv"))
    try:
        rows = run_windows(items, args.rounds, args.window, args.gap, args.settle, args.block)
    finally:
        samples = sampler.stop()
    attach_clocks(rows, samples, args.settle)
    summary = summarize(rows)
    for ref, share in summary["step_share"].items():
        print(f"step / {ref:22s} burst {share['burst']['median']:.3f} "
              f"({share['burst']['min']:.3f}-{share['burst']['max']:.3f})  sustained "
              f"{share['sustained']['median']:.3f} ({share['sustained']['min']:.3f}-"
              f"{share['sustained']['max']:.3f})", flush=True)
    write_json(os.path.join(args.out, f"interleaved_16bit{suffix}.json"),
               {"meta": metadata("cupy", "nvmath", "jax"), "model": MODEL,
                "matmul": [MM, MM, MM], "settings": vars(args), "summary": summary,
                "windows": rows})


if __name__ == "__main__":
    main()
