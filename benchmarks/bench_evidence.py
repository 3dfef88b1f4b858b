"""Overhead of the evidence that each attack worked (issue 26): a PGD-20 run end to end
(``rbp.evaluate``: load, attack, records, summary) with the telemetry switched off, on (the
default), with ``--trace`` and with ``--indicators``, interleaved in one process (median of
repetitions, each into a fresh run folder). Prints each time and its ratio to the run without
telemetry; the target is < 3% for the default (telemetry without --trace).

    python benchmarks/bench_evidence.py [--model pid_deit] [--limit 128] [--reps 5]
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

from _common import machine, timed_interleaved


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

    ta = timed_interleaved({"no telemetry": attack_only(False), "telemetry": attack_only(True),
                            "telemetry + trace": attack_only(True, True)}, torch.device(a.device), reps=a.reps)
    print(f"{machine()}; {a.model}, PGD-20 at 4/255 (no early stop), {a.limit} digits, the attack call alone, "
          f"median of {a.reps}, interleaved")
    for k, v in ta.items():
        print(f"  {k:26s} {v:7.3f} s   ratio {v / ta['no telemetry']:.3f}")

    fns = {"no telemetry": run(False), "telemetry": run(True), "telemetry + --trace": run(True, trace=True),
           "telemetry + --indicators": run(True, indicators=True)}
    t = timed_interleaved(fns, torch.device(a.device), reps=a.reps)
    shutil.rmtree(root, ignore_errors=True)
    base = t["no telemetry"]
    print(f"{machine()}; {a.model}, PGD-20 at 4/255 (early stop), {a.limit} digits, end to end, "
          f"median of {a.reps}, interleaved")
    for k, v in t.items():
        print(f"  {k:26s} {v:7.3f} s   ratio {v / base:.3f}")
    print(f"telemetry overhead: {100 * (t['telemetry'] / base - 1):+.1f}% (target < 3%); --trace: "
          f"{100 * (t['telemetry + --trace'] / base - 1):+.1f}%; --indicators (adds the unconstrained run and "
          f"the noise check): {100 * (t['telemetry + --indicators'] / base - 1):+.1f}%")


if __name__ == "__main__":
    main()
