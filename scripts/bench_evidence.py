"""Overhead of the evidence that each attack worked (issue 26): a PGD-20 run end to end
(``rbp.evaluate``: load, attack, records, summary) with the telemetry switched off, on (the
default), with ``--trace`` and with ``--indicators``, interleaved in one process (each into a fresh
run folder); and the PGD-20 attack call alone with the telemetry off, on, and tracing. Prints the
median and the minimum of each and their ratios to the run without telemetry; the target is < 3%
for the default (telemetry without --trace).

    python scripts/bench_evidence.py [--model pid_deit] [--limit 128] [--reps 5]
"""
from __future__ import annotations

import argparse
import itertools
import shutil
import tempfile
from pathlib import Path

import torch

import robustbench_pid as rbp
from robustbench_pid.attacks import telemetry

from _common import machine
from robustbench_pid.run.speed import interleaved_times


def interleaved(fns, device: torch.device, reps: int):
    """Every call's seconds, round-robin after one warm-up round (robustbench_pid.run.speed). Both the median and
    the minimum are reported: on a shared machine other work only ever adds time, so the minimum is the least
    disturbed figure and the median the typical one."""
    return interleaved_times(fns, device, reps, warmup=1)


def show(times, base: str) -> None:
    import statistics

    med = {k: statistics.median(v) for k, v in times.items()}
    low = {k: min(v) for k, v in times.items()}
    for k in times:
        print(f"  {k:26s} median {med[k]:7.3f} s (ratio {med[k] / med[base]:.3f})   "
              f"min {low[k]:7.3f} s (ratio {low[k] / low[base]:.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="pid_deit")
    ap.add_argument("--limit", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_evidence_"))
    counter = itertools.count()

    def run(on: bool, **kw):
        def go():
            telemetry.ENABLED[0] = on
            try:
                out = root / f"r{next(counter)}"
                rbp.evaluate(a.model, attack="pgd", eps="4/255", steps=20, limit=a.limit, batch_size=a.limit,
                             device=a.device, out=out, **kw)
                shutil.rmtree(out)
            finally:
                telemetry.ENABLED[0] = True
        return go

    # the attack loop alone (no loading, records or summary): where the per-step telemetry lives
    from robustbench_pid.attacks import make_attack

    model = rbp.load_model(a.model).to(a.device)
    data = rbp.load_dataset("digits", "test")
    x, y = data.images[:a.limit].to(a.device), data.labels[:a.limit].to(a.device)
    pgd = make_attack("pgd", eps=4 / 255, steps=20, early_stop=False)

    def attack_only(on: bool, trace: bool = False):
        def go():
            telemetry.ENABLED[0] = on
            try:
                pgd(model, x, y, trace=trace)
            finally:
                telemetry.ENABLED[0] = True
        return go

    ta = interleaved({"no telemetry": attack_only(False), "telemetry": attack_only(True),
                      "telemetry + trace": attack_only(True, True)}, torch.device(a.device), reps=a.reps)
    print(f"{machine()}; {a.model}, PGD-20 at 4/255 (no early stop), {a.limit} digits, the attack call alone, "
          f"{a.reps} interleaved repetitions")
    show(ta, "no telemetry")

    fns = {"no telemetry": run(False), "telemetry": run(True), "telemetry + --trace": run(True, trace=True),
           "telemetry + --indicators": run(True, indicators=True)}
    t = interleaved(fns, torch.device(a.device), reps=a.reps)
    shutil.rmtree(root, ignore_errors=True)
    print(f"{machine()}; {a.model}, PGD-20 at 4/255 (early stop), {a.limit} digits, end to end (rbp.evaluate), "
          f"{a.reps} interleaved repetitions")
    show(t, "no telemetry")
    for stat, f in (("median", lambda v: sorted(v)[len(v) // 2]), ("min", min)):
        base = f(t["no telemetry"])
        print(f"{stat}: telemetry overhead {100 * (f(t['telemetry']) / base - 1):+.1f}% (target < 3%); --trace "
              f"{100 * (f(t['telemetry + --trace']) / base - 1):+.1f}%; --indicators (adds the unconstrained run "
              f"and the noise check) {100 * (f(t['telemetry + --indicators']) / base - 1):+.1f}%")


if __name__ == "__main__":
    main()
