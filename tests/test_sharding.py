"""Sharded runs (torchrun ranks, --shard i/n, Slurm arrays) give per-sample records identical to
one process; merge checks exactly-once coverage and names missing shards."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from robustbench_pid.cli import main as cli_main
from robustbench_pid.errors import UserError
from robustbench_pid.runtime.launcher import launch
from robustbench_pid.results.files.merge import IncompleteRun, merge
from robustbench_pid.run.runner import run
from robustbench_pid.specs import RunSpec

from conftest import small_pgd_spec

TORCHRUN = Path(sys.executable).parent / "torchrun"
# CPU processes, explicitly: this file is about how work is split, and its processes compare records
# exactly with an in-process reference (a machine with fewer GPUs than ranks would also refuse them)
ARGS = ["--model", "pid_deit", "--attack", "pgd", "--eps", "2/255,4/255", "--steps", "5", "--limit", "60",
        "--chunk-size", "10", "--batch-size", "16", "--quiet", "--device", "cpu"]


def spec(out: Path, **kw) -> RunSpec:
    return small_pgd_spec(out, 60, **{"device": "cpu", **kw})


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run(spec(tmp_path_factory.mktemp("ref") / "run"))
    finally:
        torch.set_num_threads(n)


def records(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / "records.parquet")


def test_torchrun_two_ranks_equal_one_process(tmp_path: Path, reference: Path) -> None:
    assert TORCHRUN.is_file()
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    p = subprocess.run([str(TORCHRUN), "--nproc_per_node", "2", "--standalone", "-m", "robustbench_pid",
                        "evaluate", *ARGS, "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    pd.testing.assert_frame_equal(records(out), records(reference), check_exact=True)
    assert (out / "summary.csv").read_text() == (reference / "summary.csv").read_text()
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "complete"
    shards = info["shards"]
    assert sorted((s["shard"], s["n_shards"]) for s in shards) == [(0, 2), (1, 2)]
    assert sum(s["units_computed"] for s in shards) == info["n_units"] == 18  # each unit computed once
    assert all(s["units_assigned"] == 9 for s in shards) and len({s["pid"] for s in shards}) == 2
    rank0 = next(s for s in shards if s["shard"] == 0)
    assert info["finalized_by"]["pid"] == rank0["pid"]  # rank 0 waited for rank 1 and wrote the tables


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs: one torchrun rank per GPU "
                    f"(this machine has {torch.cuda.device_count()})")
def test_torchrun_ranks_each_take_their_own_gpu(tmp_path: Path) -> None:
    """On CUDA, rank r runs on cuda:LOCAL_RANK (not every rank on GPU 0), and two GPU ranks give the
    records one GPU process gives (same device type, so only the work split differs)."""
    out, ref = tmp_path / "run", tmp_path / "ref"
    gpu_args = [a for a in ARGS if a not in ("--device", "cpu")] + ["--device", "auto"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    p = subprocess.run([str(TORCHRUN), "--nproc_per_node", "2", "--standalone", "-m", "robustbench_pid",
                        "evaluate", *gpu_args, "--out", str(out)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    shards = json.loads((out / "run.json").read_text())["shards"]
    assert sorted((s["shard"], s["device"]) for s in shards) == [(0, "cuda:0"), (1, "cuda:1")]
    p = subprocess.run([sys.executable, "-m", "robustbench_pid", "evaluate", *gpu_args, "--out", str(ref)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    cols = ["sample_id", "attack", "eps", "correct_top1", "correct_top5"]
    pd.testing.assert_frame_equal(records(out)[cols], records(ref)[cols], check_exact=True)


def test_explicit_shards_then_merge_equal_one_process(tmp_path: Path, reference: Path, capsys) -> None:
    out = tmp_path / "run"
    run(spec(out, shard="0/2"))
    assert not (out / "records.parquet").exists()  # shard 1 has not run: nothing assembled yet
    # a missing shard makes merge fail, naming the shard and the missing units
    with pytest.raises(IncompleteRun) as exc:
        merge(out)
    msg = str(exc.value)
    assert "9 of 18 work units are missing" in msg and "shard 1/2: 9 unit(s) missing" in msg
    assert "never started" in msg and "pgd eps=2/255 samples [10:20]" in msg
    assert cli_main(["merge", str(out)]) == 2
    assert "shard 1/2" in capsys.readouterr().err
    # the last shard to finish assembles the run by itself ...
    run(spec(out, shard="1/2"))
    pd.testing.assert_frame_equal(records(out), records(reference), check_exact=True)
    assert (out / "summary.csv").read_text() == (reference / "summary.csv").read_text()
    # ... and an explicit merge gives the same tables again
    (out / "summary.csv").unlink()
    assert cli_main(["merge", str(out), "--quiet"]) == 0
    assert (out / "summary.csv").read_text() == (reference / "summary.csv").read_text()
    pd.testing.assert_frame_equal(records(out), records(reference), check_exact=True)


def _restamp(parquet: Path) -> None:
    """Record the file's current sha256 in its unit json, as if it had been written like this."""
    from robustbench_pid.results.files.integrity import sha256_bytes

    meta = parquet.with_suffix(".json")
    m = json.loads(meta.read_text())
    meta.write_text(json.dumps({**m, "parquet_sha256": sha256_bytes(parquet.read_bytes())}))


def test_merge_rejects_duplicated_or_foreign_samples(tmp_path: Path, reference: Path) -> None:
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    plan = json.loads((out / "plan.json").read_text())
    pgd = [u for u in plan["units"] if u["attack"] == "pgd" and u["eps"] == 2 / 255]
    a, b = pgd[0], pgd[1]  # same configuration, samples [0:10] and [10:20]
    df = pd.read_parquet(out / "units" / f"{a['key']}.parquet")
    # unit b's file now holds unit a's samples (stamped as b): sample 0..9 twice, 10..19 never
    df.assign(unit=b["key"]).to_parquet(out / "units" / f"{b['key']}.parquet", index=False)
    # the file no longer matches the checksum written with it: refused before anything else
    with pytest.raises(UserError, match=rf"units/{b['key']}.parquet does not match the sha256"):
        merge(out)
    # a unit consistent with its checksum but with the wrong samples (e.g. from a buggy writer)
    _restamp(out / "units" / f"{b['key']}.parquet")
    with pytest.raises(UserError, match=r"(?s)exactly-once.*samples missing"):
        merge(out)
    # one sample duplicated inside a unit
    df2 = pd.concat([df, df.iloc[:1]], ignore_index=True)
    for k in ("parquet", "json"):
        shutil.copy(reference / "units" / f"{b['key']}.{k}", out / "units" / f"{b['key']}.{k}")
    df2.to_parquet(out / "units" / f"{a['key']}.parquet", index=False)
    _restamp(out / "units" / f"{a['key']}.parquet")
    with pytest.raises(UserError, match="appear more often"):
        merge(out)
    for k in ("parquet", "json"):
        shutil.copy(reference / "units" / f"{a['key']}.{k}", out / "units" / f"{a['key']}.{k}")
    merge(out)
    pd.testing.assert_frame_equal(records(out), records(reference), check_exact=True)


def test_launch_reads_shard_from_flag_torchrun_or_slurm(monkeypatch) -> None:
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT",
              "SLURM_ARRAY_TASK_MIN"):
        monkeypatch.delenv(k, raising=False)

    def shard(flag=None):
        got = launch(flag)
        return got.kind, got.index, got.count

    assert shard() == ("single", 0, 1)
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "12")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "10")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "4")
    assert shard() == ("slurm-array", 2, 4)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert shard() == ("torchrun", 3, 8)  # torchrun wins over the array (torchrun inside an array task)
    assert launch(None).is_torchrun and launch(None).leads_node  # no LOCAL_RANK: speaks for its node
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert not launch(None).leads_node
    assert shard("1/2") == ("shard", 1, 2)  # explicit wins over both
    assert not launch("1/2").is_torchrun
    monkeypatch.setenv("RANK", "8")
    with pytest.raises(UserError, match="shard 8 of 8"):
        launch(None)
    for bad in ("2/2", "1-2", "a/b", "-1/3"):
        with pytest.raises(UserError, match="--shard"):
            launch(bad)


def test_shards_partition_the_plan_exactly(tmp_path: Path, reference: Path) -> None:
    from robustbench_pid.results.files.units import unit_from_dict
    from robustbench_pid.run.plan import shard_units

    units = [unit_from_dict(d) for d in json.loads((reference / "plan.json").read_text())["units"]]
    for n in (1, 2, 3, 7, 40):
        parts = [shard_units(units, i, n) for i in range(n)]
        keys = [u.key for p in parts for u in p]
        assert sorted(keys) == sorted(u.key for u in units) and len(set(keys)) == len(units)
        assert max(map(len, parts)) - min(map(len, parts)) <= 1  # balanced


def test_exactly_once_check_on_synthetic_units() -> None:
    from robustbench_pid.specs import Unit
    from robustbench_pid.results.files.merge import check_records

    ids = [f"s{i}" for i in range(6)]

    def unit(s: int, e: int, key: str) -> Unit:
        return Unit("adversarial", "pgd", 0.1, "{}", "", s, e, key * 12)

    def frame(u: Unit, rows_per_sample: int = 1) -> pd.DataFrame:
        return pd.DataFrame({"unit": u.key, "sample_id": [s for s in ids[u.start:u.stop] for _ in range(rows_per_sample)]})

    good = [unit(0, 3, "a"), unit(3, 6, "b")]
    check_records(good, [frame(u) for u in good], ids)
    check_records(good, [frame(u, 4) for u in good], ids)  # several rows per sample (e.g. per layer) is fine
    bad = [unit(0, 4, "a"), unit(3, 6, "b")]  # a planner bug: sample s3 in two units
    with pytest.raises(UserError, match=r"overlap on samples \[3:4\]"):
        check_records(bad, [frame(u) for u in bad], ids)
    with pytest.raises(UserError, match="repeats sample ids"):
        check_records(good, [frame(u) for u in good], ids[:5] + ["s0"])


def test_rank0_waits_while_claims_beat_and_gives_up_without(tmp_path: Path, monkeypatch) -> None:
    import threading
    import time

    from robustbench_pid.specs import Unit
    from robustbench_pid.run.claims import wait_for_units
    from robustbench_pid.results.files.run_files import unit_done

    monkeypatch.setenv("ROBUSTBENCH_PID_CLAIM_TIMEOUT", "0.3")
    u = Unit("adversarial", "clean", 0.0, "{}", "", 0, 10, "a" * 64)
    t = time.time()
    wait_for_units(tmp_path, [u], quiet=True)  # nothing running anywhere: give up after the timeout
    assert not unit_done(tmp_path, u.key) and time.time() - t < 3
    claim = tmp_path / f"{u.key}.claim"
    claim.write_text("{}")

    def other_rank() -> None:  # computes for 1.2 s with a heartbeat, then writes the unit
        for _ in range(12):
            time.sleep(0.1)
            os.utime(claim)
        (tmp_path / f"{u.key}.parquet").write_bytes(b"x")
        (tmp_path / f"{u.key}.json").write_text("{}")

    th = threading.Thread(target=other_rank)
    t = time.time()
    th.start()
    wait_for_units(tmp_path, [u], quiet=True)
    th.join()
    assert unit_done(tmp_path, u.key) and time.time() - t >= 1.2


def test_merge_module_imports_no_torch() -> None:
    """``merge`` runs where no model is loaded: its modules (plan, run files, checks, summaries) do
    not import torch (checked with the package's own __init__ bypassed, which loads the zoo)."""
    code = ("import importlib.util, sys, types\n"
            "spec = importlib.util.find_spec('robustbench_pid')\n"
            "pkg = types.ModuleType('robustbench_pid'); pkg.__path__ = list(spec.submodule_search_locations)\n"
            "sys.modules['robustbench_pid'] = pkg\n"
            "import robustbench_pid.results.files.merge, robustbench_pid.cli.merge\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.stdout.strip() == "[]"
