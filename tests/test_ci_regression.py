"""The project's own robustness regression guard: the embedded models on the `smoke` suite must
reproduce the committed baseline (deterministic on CPU, so the tolerance is tight).

When a change is meant to move these numbers, regenerate the baseline deliberately:
    evaluate --model deit --suite smoke --device cpu --out results/ci/deit-smoke
    evaluate --model pid_deit --suite smoke --device cpu --out results/ci/pid_deit-smoke
    robustbench-pid check results/ci --baseline results/baselines/smoke-digits.csv --update
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "results" / "baselines" / "smoke-digits.csv"
BIN = Path(sys.executable).parent


def _run(tool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which(tool, path=str(BIN)) or tool
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=900)


def test_smoke_suite_matches_committed_baseline(tmp_path: Path) -> None:
    for model in ("deit", "pid_deit"):
        # on the CPU, where the committed baseline was made (same device + seed: the same floats)
        p = _run("evaluate", "--model", model, "--suite", "smoke", "--out", f"ci/{model}-smoke", "--quiet",
                 "--device", "cpu", cwd=tmp_path)
        assert p.returncode == 0, p.stderr
    p = _run("robustbench-pid", "check", "ci", "--baseline", str(BASELINE), "--tolerance", "0.5", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    # the guard is real: every baseline row was compared, and a lowered baseline number is caught
    base = pd.read_csv(BASELINE)
    assert set(base["model"]) == {"deit", "pid_deit"} and len(base) >= 30
    worse = base.copy()
    row = worse.index[(worse["attack"] == "pgd") & (worse["metric"] == "top1")][0]
    worse.loc[row, "value"] += 5.0  # pretend the baseline was 5 points better
    worse.to_csv(tmp_path / "raised.csv", index=False)
    p = _run("robustbench-pid", "check", "ci", "--baseline", str(tmp_path / "raised.csv"), "--tolerance", "0.5",
             cwd=tmp_path)
    assert p.returncode == 1 and "REGRESSED" in p.stdout
