"""Start-up time of the command line: ``evaluate --help`` and ``robustbench-pid VERB --help`` as fresh
processes (median of 3), next to ``python -c "import torch"`` for scale.

    python scripts/bench_startup.py [--reps 3]

Run it on an idle machine for figures to publish; other load on the CPU lengthens every line alike.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parents[1]


def wall(argv: List[str], reps: int) -> float:
    """Median wall seconds of ``argv`` as a fresh process (run once first to warm the file cache)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    times = []
    for i in range(reps + 1):
        t = time.perf_counter()
        p = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed:\n{p.stderr}")
        if i:
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))  # this checkout's package, as the timed processes get it
    from robustbench_pid.cli import verbs

    py = sys.executable
    rows = [("python -c 'import torch'  (scale)", [py, "-c", "import torch"]),
            ("python -c 'import robustbench_pid'", [py, "-c", "import robustbench_pid"]),
            ("evaluate --help", [py, "-c", "from robustbench_pid.cli import evaluate_main; evaluate_main()", "--help"])]
    rows += [(f"robustbench-pid {v} --help", [py, "-m", "robustbench_pid", v, "--help"]) for v in verbs()]
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
          f"median of {args.reps} fresh processes")
    for label, argv in rows:
        print(f"{label:<42} {wall(argv, args.reps):6.2f} s")


if __name__ == "__main__":
    main()
