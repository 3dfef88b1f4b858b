"""``evaluate --dry-run``: the plan, passes per unit and an estimated time, computing and writing nothing.

Passes come from the benchmark (``Benchmark.passes``) and, for attacks, from the attack
(``Attack.passes``): worst cases, every sample attacked to the end. Seconds per pass are measured
on one batch of the run's own data, model, device and precision.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import List, Tuple

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


def calibrate(ctx: Context, reps: int = 3) -> Tuple[float, float]:
    """Seconds per image of one forward and of one forward+backward-to-input pass, measured on
    one batch of the run's own data, model, device and precision (median of ``reps``)."""
    u = Unit("calibration", "clean", 0.0, "{}", "", 0, min(len(ctx.indices), ctx.batch_size), "0" * 64)
    b = next(ctx.batches(u))
    x, y = b.x, b.y
    model = ctx.verdict_model()
    amodel = ctx.attacked_model()

    def sync() -> None:
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)

    def fwd() -> None:
        with torch.inference_mode():
            model(x)

    def fb() -> None:  # the pass doctor and the benchmark scripts time (robustbench_pid.run.speed)
        forward_backward(amodel, x, y, ctx.spec.precision)

    out = []
    for fn in (fwd, fb):
        fn()
        sync()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t)
        out.append(float(np.median(times)) / len(y))
    return out[0], out[1]


def dry_run(ctx: Context, out: Path, units: List[Unit], mine: List[Unit], shard: Tuple[int, int]) -> None:
    """Print the plan, passes per unit and an estimated time; write nothing."""
    spec = ctx.spec
    if spec.calibration is not None:  # priced for another device: nothing is measured here
        t_f, t_fb = 1.0 / spec.calibration[0], 1.0 / spec.calibration[1]
        where = "the given calibration"
        device_line = (f"calibration given (--calibration): forward {spec.calibration[0]:g} img/s, "
                       f"forward+backward {spec.calibration[1]:g} img/s, i.e. ")
    else:
        t_f, t_fb = calibrate(ctx)
        where = f"one {ctx.device.type} device like this one"
        device_line = (f"calibration on {ctx.device} ({device_name(ctx.device)}), batch {ctx.batch_size}, "
                       f"precision {spec.precision}: ")
    units_dir = out / "units"
    i, n = shard
    mine_keys = {u.key for u in mine}
    print(f"dry run: {spec.model} on {spec.dataset} ({spec.split}), {len(ctx.indices)} samples, protocol "
          f"{spec.protocol}, benchmark {spec.benchmark}; run folder {out}")
    print(f"{device_line}forward {1e3 * t_f:.3f} ms/img, forward+backward {1e3 * t_fb:.3f} ms/img")
    hdr = f"{'unit':12}  {'shard':>5}  {'attack':14} {'eps':>8}  {'condition':14} {'samples':>13}  " \
          f"{'fwd/img':>8} {'f+b/img':>8}  {'status':6} {'est. s':>9}"
    print(hdr)
    tot = {"f": 0.0, "fb": 0.0, "est": 0.0, "todo": 0}
    mine_tot = {"f": 0.0, "fb": 0.0, "est": 0.0, "todo": 0}
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
        print(f"{u.key[:12]:12}  {j % n:>5}  {u.attack[:14]:14} {eps:>8}  {(u.condition or '-')[:14]:14} "
              f"{f'{u.start}:{u.stop}':>13}  {f:>8g} {b:>8g}  {status:6} {est:>9.1f}")
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
