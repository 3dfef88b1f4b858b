"""Two processes pointed at one results folder split the work through claims, never corrupt it,
and both finish with the records of a single uninterrupted run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from robustbench_pid.run.runner import run
from robustbench_pid.specs import AttackSpec, RunSpec

ARGS = ["--model", "pid_deit", "--attack", "pgd", "--eps", "2/255,4/255", "--steps", "5", "--limit", "80",
        "--chunk-size", "10", "--batch-size", "16", "--quiet"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    attacks = [AttackSpec("pgd", {"eps": e / 255, "steps": 5, "step_size": None, "step_size_factor": None,
                                  "random_start": True, "early_stop": True, "stop_topk": 5}) for e in (2, 4)]
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # the subprocesses run with OMP_NUM_THREADS=1
    try:
        return run(RunSpec(model="pid_deit", attacks=attacks, limit=80, chunk_size=10, batch_size=16,
                           out=tmp_path_factory.mktemp("ref") / "run", quiet=True))
    finally:
        torch.set_num_threads(n)


def test_two_concurrent_runs_into_one_folder(tmp_path: Path, reference: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "robustbench_pid", "evaluate", *ARGS, "--out", str(out)]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    for p, (so, se) in zip(procs, results):
        assert p.returncode == 0, se[-3000:]
        assert "pgd" in so and "wrote" in so  # both saw a complete run and printed its table
    got = pd.read_parquet(out / "records.parquet")
    pd.testing.assert_frame_equal(got, pd.read_parquet(reference / "records.parquet"), check_exact=True)
    assert (out / "summary.csv").read_text() == (reference / "summary.csv").read_text()
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "complete" and info["n_records"] == len(got) == 80 * 3
    # every unit computed exactly once, by one of the two processes (claims, no duplicated work)
    metas = [json.loads(p.read_text()) for p in (out / "units").glob("*.json")]
    pids = {p.pid for p in procs}
    assert len(metas) == 24 and {m["pid"] for m in metas} <= pids
    shards = [s for s in info["shards"] if s["pid"] in pids]
    assert len(shards) == 2 and sum(s["units_computed"] for s in shards) == 24
    print("units per process:", {p: sum(m["pid"] == p for m in metas) for p in pids})
    # nothing left behind: no claims, no temp files, a readable parquet per unit
    assert not list(out.rglob("*.claim")) and not list(out.rglob("*.tmp"))
    for m in metas:
        assert len(pd.read_parquet(out / "units" / f"{m['key']}.parquet")) == m["n"] == 10
