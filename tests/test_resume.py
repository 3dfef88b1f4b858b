"""Exact resume: a run killed with SIGKILL at any moment, re-run, gives per-sample records
identical to an uninterrupted run; partial unit files, temp files and stale claims are handled."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pandas as pd
import pytest
import torch

from robustbench_pid.run.claims import Claims
from robustbench_pid.results.files.merge import IncompleteRun, merge
from robustbench_pid.run.runner import run
from robustbench_pid.specs import RunSpec

from conftest import small_pgd_spec

ARGS = ["--model", "pid_deit", "--attack", "pgd", "--eps", "2/255,4/255", "--steps", "5", "--limit", "80",
        "--chunk-size", "10", "--batch-size", "16", "--quiet"]


def spec(out: Path, **kw) -> RunSpec:
    return small_pgd_spec(out, 80, **kw)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> pd.DataFrame:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = run(spec(tmp_path_factory.mktemp("ref") / "run"))
    finally:
        torch.set_num_threads(n)
    return pd.read_parquet(out / "records.parquet")


def evaluate_cmd(out: Path) -> List[str]:
    return [sys.executable, "-m", "robustbench_pid", "evaluate", *ARGS, "--out", str(out)]


def env1() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def done_units(out: Path) -> List[str]:
    d = out / "units"
    if not d.is_dir():
        return []
    return sorted(p.stem for p in d.glob("*.json") if (d / f"{p.stem}.parquet").is_file())


def test_sigkill_mid_run_then_resume_is_identical(tmp_path: Path, reference: pd.DataFrame, one_thread) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(evaluate_cmd(out), env=env1(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while len(done_units(out)) < 5 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    before = done_units(out)
    n_units = len(json.loads((out / "plan.json").read_text())["units"])
    assert 5 <= len(before) < n_units == 24
    assert not (out / "records.parquet").exists()
    assert json.loads((out / "run.json").read_text())["status"] == "running"
    # merge refuses, naming what is missing and that the process died
    with pytest.raises(IncompleteRun, match=f"shard 0/1: {n_units - len(before)} unit\\(s\\) missing; that shard died"):
        merge(out)
    # resume: only the missing units are computed, the result equals the uninterrupted run
    run(spec(out))
    got = pd.read_parquet(out / "records.parquet")
    pd.testing.assert_frame_equal(got, reference, check_exact=True)
    shards = [json.loads(p.read_text()) for p in (out / "shards").glob("*.json")]
    resumed = [s for s in shards if s["pid"] == os.getpid()]
    assert len(resumed) == 1 and resumed[0]["units_computed"] == n_units - len(before)
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    # nothing of the killed process survives: no claims, no temp files
    assert not list((out / "units").glob("*.claim")) and not list(out.rglob("*.tmp"))


def test_every_kill_point_resumes_exactly(tmp_path: Path, reference: pd.DataFrame, one_thread) -> None:
    """Recreate the states a kill can leave between any two steps of writing units."""
    out = tmp_path / "run"
    run(spec(out))
    units = out / "units"
    keys = sorted(p.stem for p in units.glob("*.json"))
    k_json, k_parq, k_tmp, k_claim = keys[:4]
    # killed after the parquet rename, before the json rename: unit not done
    (units / f"{k_json}.json").unlink()
    # a json without its parquet (cannot happen with our order, but "done" needs both)
    (units / f"{k_parq}.parquet").unlink()
    # killed while writing: a half-written temp file, and the unit never renamed
    (units / f"{k_tmp}.parquet").write_bytes(b"")  # not even valid parquet ...
    (units / f"{k_tmp}.parquet").unlink()  # ... and in fact never renamed
    (units / f"{k_tmp}.json").unlink()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (units / f".{k_tmp}.parquet.{os.uname().nodename}.{dead.pid}.abcd1234.tmp").write_bytes(b"PAR1 trunc")
    # killed while computing: a claim held by a process that no longer exists
    (units / f"{k_claim}.claim").write_text(json.dumps({"host": os.uname().nodename, "pid": dead.pid,
                                                        "pid_start": None, "token": "x"}))
    (units / f"{k_claim}.json").unlink()
    (units / f"{k_claim}.parquet").unlink()
    (out / "records.parquet").unlink()
    t0 = time.time()
    run(spec(out))
    assert time.time() - t0 < 60  # the dead claim was taken over, not waited out
    pd.testing.assert_frame_equal(pd.read_parquet(out / "records.parquet"), reference, check_exact=True)
    latest = max((json.loads(p.read_text()) for p in (out / "shards").glob("*.json")), key=lambda s: s["t_finished"])
    assert latest["units_computed"] == 4
    assert not list(units.glob("*.claim")) and not list(units.glob("*.tmp"))


def test_complete_run_rerun_computes_nothing(tmp_path: Path, reference: pd.DataFrame, one_thread) -> None:
    out = tmp_path / "run"
    run(spec(out))
    mtimes = {p.name: p.stat().st_mtime_ns for p in (out / "units").iterdir()}
    run(spec(out))
    assert {p.name: p.stat().st_mtime_ns for p in (out / "units").iterdir()} == mtimes
    shards = sorted((json.loads(p.read_text()) for p in (out / "shards").glob("*.json")), key=lambda s: s["t_finished"])
    assert [s["units_computed"] for s in shards] == [24, 0]
    pd.testing.assert_frame_equal(pd.read_parquet(out / "records.parquet"), reference, check_exact=True)


def test_live_claim_is_waited_for_and_stale_claim_taken_over(tmp_path: Path, monkeypatch) -> None:
    units = tmp_path / "units"
    units.mkdir()
    a, b = Claims(units, timeout=5), Claims(units, timeout=5)
    assert a.try_claim("k1") and not b.try_claim("k1")  # a live claim (same host, live pid, fresh)
    a.release("k1")
    assert b.try_claim("k1")
    b.release("k1")
    # a claim by another host: stale only once its heartbeat is older than the timeout
    p = units / "k2.claim"
    p.write_text(json.dumps({"host": "elsewhere", "pid": 1, "token": "t"}))
    assert not a.try_claim("k2")
    old = time.time() - 10
    os.utime(p, (old, old))
    assert a.try_claim("k2") and json.loads(p.read_text())["token"] == a.token
    # the heartbeat keeps a held claim fresh
    with Claims(units, timeout=1.0) as c:
        assert c.try_claim("k3")
        os.utime(units / "k3.claim", (old, old))
        time.sleep(0.8)
        assert time.time() - (units / "k3.claim").stat().st_mtime < 1.0
    assert not (units / "k3.claim").exists()  # released on exit


@pytest.mark.slow
def test_repeated_sigkills_at_random_moments(tmp_path: Path, reference: pd.DataFrame, one_thread) -> None:
    """Kill the same run five times at random moments (start-up, mid-unit, mid-write, finalize),
    resuming each time; the records equal the uninterrupted run."""
    import random as _random

    rng = _random.Random(0)
    out = tmp_path / "run"
    kills = 0
    for _ in range(5):
        proc = subprocess.Popen(evaluate_cmd(out), env=env1(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.5, 6.0))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
    assert kills >= 3
    p = subprocess.run(evaluate_cmd(out), env=env1(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    pd.testing.assert_frame_equal(pd.read_parquet(out / "records.parquet"), reference, check_exact=True)
    assert not list((out / "units").glob("*.claim")) and not list(out.rglob("*.tmp"))
