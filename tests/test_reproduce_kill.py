"""``reproduce`` killed for real: the PIDformer Table 1 study (the generated trees and random 1-block
checkpoints of test_reproduce.py) run as a subprocess, SIGKILLed in the middle of a row, then re-run:
the units finished before the kill are not recomputed, every row completes, and the table equals the
table of an uninterrupted run of the same command (test_resume.py does the same for one ``evaluate``)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pandas as pd

import robustbench_pid
from robustbench_pid.cli import main
from robustbench_pid.studies.spec import load_study

from test_reproduce import TINY, data  # noqa: F401  (the module-scoped fixture: trees + checkpoints)

ROOT = Path(robustbench_pid.__file__).resolve().parents[1]  # the checkout whose code the subprocess runs
ROW = "spsa"  # the slow row: the kill lands while its last unit is computed (~3 s of SPSA per 2 images)


def args(data: Path, out: Path) -> List[str]:
    """Limit 4 in chunks of 2: every attack row is 4 units (clean and attack, 2 chunks each)."""
    return ["reproduce", "pidformer-table1", "--model", "pid_deit", "--checkpoint", str(data / "pid_deit.safetensors"),
            *TINY, "--data-root", str(data), "--out", str(out), "--limit", "4", "--chunk-size", "2", "--quiet",
            "--device", "cpu", "--batch-size", "64"]


def env1() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]).rstrip(os.pathsep)}


def row_dirs(out: Path) -> Dict[str, Path]:
    return {p.name: p for p in sorted(out.glob("*/paper/*")) if p.is_dir()}


def done_units(run_dir: Path) -> Dict[Path, int]:
    """Finished units (parquet and its json, the runner's "done") -> the parquet's mtime."""
    d = run_dir / "units"
    if not d.is_dir():
        return {}
    return {p: p.stat().st_mtime_ns for p in d.glob("*.parquet") if p.with_suffix(".json").is_file()}


def all_done_units(out: Path) -> Dict[Path, int]:
    return {p: t for d in row_dirs(out).values() for p, t in done_units(d).items()}


def status(run_dir: Path) -> str:
    return json.loads((run_dir / "run.json").read_text())["status"]


def test_sigkilled_study_resumes_to_the_uninterrupted_table(data, tmp_path, capsys, one_thread):
    study = load_study("pidformer-table1")
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "robustbench_pid", *args(data, out)]
    log = tmp_path / "killed.log"  # a file, not a pipe: a full pipe would stall the process we wait for
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, env=env1(), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=f)
    row = out / "pid_deit@PID-DeiT" / "paper" / ROW
    deadline = time.time() + 120
    while len(done_units(row)) < 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"finished (or failed) before the kill: {log.read_text()[-2000:]}"
    before = all_done_units(out)
    rows = row_dirs(out)
    assert len(done_units(row)) == 3 and ROW in rows and len(rows) < len(study.rows)
    # the killed state looks unfinished everywhere: the row killed "running", no table, merge refuses it
    assert status(row) == "running" and not (row / "records.parquet").exists()
    assert not any((out / f"table.{ext}").exists() for ext in ("md", "csv", "tex"))
    assert main(["merge", str(out)]) == 2
    merr = capsys.readouterr().err
    assert f"{row}: 1 of 4 work units are missing" in merr and "died while running" in merr
    assert not (out / "table.csv").exists()

    # the same command again, to completion: only the missing units are computed
    again = subprocess.Popen(cmd, env=env1(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = (b.decode() for b in again.communicate(timeout=300))
    assert again.returncode == 0, stderr[-2000:]
    assert "| Clean | Top-1" in stdout and "| Imagenet-O | AUPR" in stdout
    after = all_done_units(out)
    assert {p: after.get(p) for p in before} == before  # finished before the kill: not rewritten
    rows = row_dirs(out)
    assert sorted(rows) == sorted(r.name for r in study.rows)
    assert all(status(d) == "complete" for d in rows.values())
    n_units = sum(len(json.loads((d / "plan.json").read_text())["units"]) for d in rows.values())
    assert len(after) == n_units > len(before)
    shards = [json.loads(p.read_text()) for d in rows.values() for p in (d / "shards").glob("*.json")]
    assert sum(s["units_computed"] for s in shards if s["pid"] == again.pid) == n_units - len(before)
    assert not list(out.rglob("*.claim")) and not list(out.rglob("*.tmp"))

    # the table equals the table of an uninterrupted run of the same command
    ref = tmp_path / "uninterrupted"
    assert main(args(data, ref)) == 0
    capsys.readouterr()
    key, cols = ["row", "metric", "model", "protocol"], ["paper", "value", "ci_low", "ci_high", "n"]
    got, want = (pd.read_csv(d / "table.csv").set_index(key) for d in (out, ref))
    assert len(got) == sum(len(r.metrics) for r in study.rows) and got.value.notna().all()
    pd.testing.assert_frame_equal(got[cols], want[cols], check_exact=True)
    for name, d in rows.items():  # and so do the per-sample records of every row
        pd.testing.assert_frame_equal(pd.read_parquet(d / "records.parquet"),
                                      pd.read_parquet(row_dirs(ref)[name] / "records.parquet"), check_exact=True)


class Killed(BaseException):
    """Stands for the SIGKILL (nothing catches it): the command stops between two rows."""


def test_other_settings_refused_before_any_row_and_a_cut_rerun_leaves_no_stale_table(tmp_path, capsys, monkeypatch):
    """A finished study re-run with other settings (--limit 4 over --limit 8) is refused at the start, naming the
    row folder and what differs, and its table is kept (it still matches its rows). A re-run of the same command
    cut short between two rows leaves no table until the command (or ``merge``) finishes."""
    from robustbench_pid.run import runner

    out = tmp_path / "d"
    base = ["reproduce", "digits-smoke", "--model", "pid_deit", "--quiet", "--device", "cpu", "--out", str(out),
            "--only", "clean", "--only", "fgsm-2"]
    assert main([*base, "--limit", "8"]) == 0
    table = (out / "table.csv").read_bytes()
    capsys.readouterr()
    assert main([*base, "--limit", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "another configuration (limit: 8 -> 4)" in err and "clean" in err
    assert (out / "table.csv").read_bytes() == table  # nothing ran, the table still matches its rows

    real, calls = runner.run, []

    def killed_after_one_row(spec):
        if calls:
            raise Killed()
        calls.append(spec.out)
        return real(spec)

    monkeypatch.setattr(runner, "run", killed_after_one_row)
    try:
        main([*base, "--limit", "8"])
    except Killed:
        pass
    assert [p.name for p in calls] == ["clean"] and status(calls[0]) == "complete"
    assert not any((out / f"table.{ext}").exists() for ext in ("md", "csv", "tex"))
    monkeypatch.setattr(runner, "run", real)
    assert main([*base, "--limit", "8"]) == 0
    assert (out / "table.csv").read_bytes() == table
    capsys.readouterr()
