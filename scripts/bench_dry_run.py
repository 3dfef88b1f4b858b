"""How good is ``--dry-run``'s time estimate? Each workload is planned with ``--dry-run`` and then
run for real into a fresh folder, side by side in one process of this script; the table prints the
estimate, the measured unit compute time (run.json ``compute_seconds``), the whole command's wall
time, and their ratios.

    OMP_NUM_THREADS=2 python scripts/bench_dry_run.py
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Tuple

from _common import machine

WORKLOADS: List[Tuple[str, List[str]]] = [
    ("quickstart: pid_deit PGD-20 x 6 eps", ["--model", "pid_deit", "--attack", "pgd"]),
    ("deit PGD-20 x 6 eps", ["--model", "deit", "--attack", "pgd"]),
    ("pid_deit smoke suite", ["--model", "pid_deit", "--suite", "smoke"]),
    ("deit FGSM x 6 eps", ["--model", "deit", "--attack", "fgsm"]),
]
UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}


def evaluate(args: List[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "robustbench_pid", "evaluate", *args, "--quiet", "--device", "cpu"]
    return subprocess.run(cmd, capture_output=True, text=True, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--limit", type=int, default=None, help="samples per workload (default: all 360 digits)")
    a = ap.parse_args()
    extra = ["--limit", str(a.limit)] if a.limit else []
    print(machine())
    print(f"{'workload':38} {'estimate s':>10} {'compute s':>9} {'wall s':>7} {'est/compute':>11} {'est/wall':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, args) in enumerate(WORKLOADS):
            out = Path(tmp) / f"run{i}"
            plan = evaluate([*args, *extra, "--out", str(out), "--dry-run"]).stdout
            m = re.search(r"about ([\d.]+) (s|min|h) on one", plan)
            if m is None:
                raise SystemExit(f"no estimate in the dry-run output of {name}:\n{plan}")
            est = float(m.group(1)) * UNITS[m.group(2)]
            t0 = time.perf_counter()
            evaluate([*args, *extra, "--out", str(out)])
            wall = time.perf_counter() - t0
            compute = float(json.loads((out / "run.json").read_text())["compute_seconds"])
            print(f"{name:38} {est:>10.1f} {compute:>9.1f} {wall:>7.1f} {est / compute:>11.2f} {est / wall:>8.2f}")
    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}")


if __name__ == "__main__":
    main()
