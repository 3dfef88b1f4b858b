"""``evaluate --dry-run``: the plan, passes per unit and an estimated time, computing and writing nothing.

Passes come from the benchmark (``Benchmark.passes``) and, for attacks, from the attack
(``Attack.passes``): worst cases, every sample attacked to the end. Seconds per pass are measured
on one batch of the run's own data, model, device and precision. Data or weights that are not on this
machine are no obstacle to a plan: ``plan_data`` prices the dataset at its published size and the
architecture untrained, and the plan says so.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import torch

from ..benchmarks import get_benchmark
from .speed import forward_backward
from ..results.conditions import eps_text_of
from .provenance import device_name
from .context import Context
from ..results.files.run_files import unit_done
from ..specs import Unit


def unit_passes(ctx: Context, u: Unit) -> Tuple[float, float]:
    """(forward-only, forward+backward) passes per sample for a unit if every sample is attacked to
    the end (early stopping and skipped samples lower it)."""
    from ..probes.units import extra_passes

    f, b = get_benchmark(u.benchmark).passes(ctx, u)
    return float(f) + extra_passes(ctx, u), float(b)


def calibrate(ctx: Context, reps: int = 5) -> Tuple[float, float]:
    """Seconds per image of one forward and of one forward+backward-to-input pass, measured on
    one batch of the run's own data, model, device and precision: both passes warmed up first (the first
    calls pay for allocation and lazy initialisation), then timed interleaved (so a busy shared machine
    slows both alike), median of ``reps``. A forward slower than a forward+backward (which contains one) is
    noise: measured again with more repetitions, and if it persists priced at the forward+backward time
    with a warning, never as a plan in which a forward costs more than a step of an attack."""
    from .speed import interleaved_times

    u = Unit("calibration", "clean", 0.0, "{}", "", 0, min(len(ctx.indices), ctx.batch_size), "0" * 64)
    b = next(ctx.batches(u))
    x, y = b.x, b.y
    model = ctx.verdict_model()
    amodel = ctx.attacked_model()

    def fwd() -> None:
        with torch.inference_mode():
            model(x)

    def fb() -> None:  # the pass doctor and the benchmark scripts time (robustbench_pid.run.speed)
        forward_backward(amodel, x, y, ctx.spec.precision)

    fns = {"fwd": fwd, "fb": fb}
    t = {k: float(np.median(v)) for k, v in interleaved_times(fns, ctx.device, reps=reps, warmup=2).items()}
    comparable = ctx.spec.precision == "fp32"  # bf16/fp16 attack passes may truly beat an fp32 verdict forward
    if comparable and t["fwd"] > t["fb"]:
        t = {k: float(np.median(v)) for k, v in interleaved_times(fns, ctx.device, reps=3 * reps, warmup=1).items()}
        if t["fwd"] > t["fb"]:
            print(f"warning: calibration: a forward measured slower than a forward+backward ({1e3 * t['fwd'] / len(y):.1f} "
                  f"vs {1e3 * t['fb'] / len(y):.1f} ms/img, batch {len(y)}) twice: this machine is busy or the batch too "
                  f"small to time; forward priced at the forward+backward time (an upper bound). Price it on a quiet "
                  f"machine, or give --calibration FWD,FB", file=sys.stderr)
            t["fwd"] = t["fb"]
    return t["fwd"] / len(y), t["fb"] / len(y)


# above this many units the plan prints one line per condition (its units summed), not one per unit
MAX_UNIT_LINES = 48


def dry_run(ctx: Context, out: Path, units: List[Unit], mine: List[Unit], shard: Tuple[int, int]) -> None:
    """Print the plan, passes per unit and an estimated time; write nothing."""
    from .plan_data import KnownSizeData, plan_notes

    spec = ctx.spec
    if spec.calibration is not None:  # priced for another device: nothing is measured here
        t_f, t_fb = 1.0 / spec.calibration[0], 1.0 / spec.calibration[1]
        where = "the given calibration"
        device_line = (f"calibration given (--calibration): forward {spec.calibration[0]:g} img/s, "
                       f"forward+backward {spec.calibration[1]:g} img/s, i.e. ")
    else:
        t_f, t_fb = calibrate(ctx)
        where = f"one {ctx.device.type} device like this one"
        data = " (random images: no data here)" if isinstance(ctx.dataset, KnownSizeData) else ""
        device_line = (f"calibration on {ctx.device} ({device_name(ctx.device)}), batch "
                       f"{min(ctx.batch_size, len(ctx.indices))}{data}, precision {spec.precision}, after a warm-up: ")
    units_dir = out / "units"
    i, n = shard
    mine_keys = {u.key for u in mine}
    print(f"dry run: {spec.model} on {spec.dataset} ({spec.split}), {len(ctx.indices)} samples, protocol "
          f"{spec.protocol}, benchmark {spec.benchmark}; run folder {out}")
    for note in plan_notes(ctx):
        print(note)
    print(f"{device_line}forward {1e3 * t_f:.3f} ms/img, forward+backward {1e3 * t_fb:.3f} ms/img")
    per_unit = len(units) <= MAX_UNIT_LINES
    if per_unit:
        print(f"{'unit':12}  {'shard':>5}  {'attack':14} {'eps':>8}  {'condition':14} {'samples':>13}  "
              f"{'fwd/img':>8} {'f+b/img':>8}  {'status':6} {'est. s':>9}")
    else:
        print(f"{len(units)} units: one line per condition ({spec.chunk_size} samples per unit, --chunk-size)")
        print(f"{'units':>6} {'to do':>6}  {'attack':14} {'eps':>8}  {'condition':22} {'samples':>10}  "
              f"{'fwd/img':>8} {'f+b/img':>8}  {'est.':>10}")
    tot = {"f": 0.0, "fb": 0.0, "est": 0.0, "todo": 0}
    mine_tot = {"f": 0.0, "fb": 0.0, "est": 0.0, "todo": 0}
    groups: Dict[Tuple[str, float, str, str], Dict[str, Any]] = {}
    for j, u in enumerate(units):
        f, b = unit_passes(ctx, u)
        m = u.stop - u.start
        est = m * (f * t_f + b * t_fb)
        done = unit_done(units_dir, u.key)
        status = "done" if done else "todo"
        for acc, on in ((tot, True), (mine_tot, u.key in mine_keys)):
            if on and not done:
                acc["f"] += f * m
                acc["fb"] += b * m
                acc["est"] += est
                acc["todo"] += 1
        eps = eps_text_of(u.attack, u.eps) if u.eps else "-"
        if per_unit:
            print(f"{u.key[:12]:12}  {j % n:>5}  {u.attack[:14]:14} {eps:>8}  {(u.condition or '-')[:14]:14} "
                  f"{f'{u.start}:{u.stop}':>13}  {f:>8g} {b:>8g}  {status:6} {est:>9.1f}")
            continue
        g = groups.setdefault((u.attack, u.eps, u.params, u.condition),
                              {"units": 0, "todo": 0, "samples": 0, "f": f, "b": b, "est": 0.0, "eps": eps})
        g["units"] += 1
        g["samples"] += m
        if not done:
            g["todo"] += 1
            g["est"] += est
    for (attack, _, _, cond), g in groups.items():
        print(f"{g['units']:>6} {g['todo']:>6}  {attack[:14]:14} {g['eps']:>8}  {(cond or '-')[:22]:22} "
              f"{g['samples']:>10}  {g['f']:>8g} {g['b']:>8g}  {_fmt_s(g['est']):>10}")
    print(f"total: {len(units)} units, {tot['todo']} to do: {tot['f']:.0f} forward and {tot['fb']:.0f} "
          f"forward+backward image-passes, about {_fmt_s(tot['est'])} at {where}")
    if n > 1:
        print(f"this shard ({i}/{n}): {len(mine)} units, {mine_tot['todo']} to do, about {_fmt_s(mine_tot['est'])}")
    if spec.analyze:
        print(f"--analyze {','.join(spec.analyze)}: +1 forward pass with hooks per sample and condition on the "
              f"attack's final points (no extra attack), included in fwd/img above")
    basis = "the given rates" if spec.calibration is not None else "one calibration batch"
    print(f"this is an estimate from {basis}, not a bound: early stopping and samples not attacked "
          "make a run shorter, per-unit overheads and data loading make it longer (measured error on real runs: "
          "docs/performance.md). Nothing was computed or written.")


def _fmt_s(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"
