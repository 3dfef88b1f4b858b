"""Runner details: dry run (units, passes, estimate; writes nothing), per-unit RNG isolation,
DataLoader workers, atomic temp-file hygiene and clear errors for impossible settings."""
from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from robustbench_pid.cli import main as cli_main
from robustbench_pid.errors import UserError
from robustbench_pid.run.context import prepare
from robustbench_pid.results.files.run_files import clean_stale_temps, write_parquet_atomic
from robustbench_pid.run.runner import run
from robustbench_pid.specs import AttackSpec, RunSpec


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 OpenMP threads on a loaded 2-core machine spin for seconds
    yield
    torch.set_num_threads(n)


def pgd(eps: float, steps: int = 3) -> AttackSpec:
    return AttackSpec("pgd", {"eps": eps, "steps": steps, "step_size": None, "step_size_factor": None,
                              "random_start": True, "early_stop": True, "stop_topk": 5})


def test_dry_run_prints_units_passes_and_estimate_and_writes_nothing(tmp_path: Path, capsys) -> None:
    out = tmp_path / "never"
    rc = cli_main(["evaluate", "--model", "pid_deit", "--attack", "pgd", "--eps", "2/255,3/255",
                   "--steps", "7", "--limit", "30", "--chunk-size", "10", "--batch-size", "10", "--dry-run",
                   "--out", str(out), "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert not out.exists()
    rows = [ln.split() for ln in text.splitlines() if re.match(r"^[0-9a-f]{12}\s", ln)]
    assert len(rows) == 9  # (clean, pgd 2/255, pgd 3/255) x 3 chunks of 10
    by_attack = {}
    for r in rows:  # key shard attack eps condition samples fwd f+b status est
        by_attack.setdefault(r[2], set()).add((float(r[6]), float(r[7]), r[8]))
    assert by_attack == {"clean": {(1, 0, "todo")}, "pgd": {(2, 7, "todo")}}
    m = re.search(r"forward ([\d.]+) ms/img, forward\+backward ([\d.]+) ms/img", text)
    assert m and 0 < float(m.group(1)) and 0 < float(m.group(2))
    tot = re.search(r"total: 9 units, 9 to do: (\d+) forward and (\d+) forward\+backward", text)
    assert tot and int(tot.group(1)) == 30 * (1 + 2 + 2) and int(tot.group(2)) == 30 * (7 + 7)
    est = sum(float(r[9]) for r in rows)
    assert est > 0 and "Nothing was computed or written" in text


def test_dry_run_priced_at_a_given_calibration(tmp_path: Path, capsys) -> None:
    """--calibration FWD,FB prices the plan for another device: estimate = passes / rates, exactly."""
    out = tmp_path / "never"
    args = ["evaluate", "--model", "pid_deit", "--attack", "pgd", "--eps", "2/255,3/255", "--steps", "7",
            "--limit", "30", "--chunk-size", "10", "--batch-size", "10", "--out", str(out), "--quiet"]
    assert cli_main(args + ["--dry-run", "--calibration", "10,5"]) == 0
    text = capsys.readouterr().out
    assert not out.exists()
    assert "forward 10 img/s, forward+backward 5 img/s, i.e. forward 100.000 ms/img, forward+backward " \
           "200.000 ms/img" in text
    rows = [ln.split() for ln in text.splitlines() if re.match(r"^[0-9a-f]{12}\s", ln)]
    est = {(r[2], float(r[9])) for r in rows}
    # clean: 10 images x 1 forward / 10 img/s; PGD-7: 10 x (2 forwards / 10 + 7 f+b / 5)
    assert est == {("clean", 1.0), ("pgd", 16.0)} and len(rows) == 9
    assert "about 99.0 s at the given calibration" in text and "estimate from the given rates" in text


@pytest.mark.parametrize("extra, needle", [
    (["--dry-run", "--calibration", "5"], "--calibration '5': expected FWD,FB"),
    (["--dry-run", "--calibration", "1,-2"], "two positive numbers"),
    (["--dry-run", "--calibration", "fast,slow"], "expected FWD,FB"),
    (["--calibration", "1000,500"], "add --dry-run"),
])
def test_bad_calibration_is_one_clear_error(tmp_path: Path, capsys, extra, needle) -> None:
    from robustbench_pid.cli import evaluate_main

    out = tmp_path / "never"
    rc = evaluate_main(["--model", "deit", "--attack", "fgsm", "--limit", "4", "--out", str(out), "--quiet"] + extra)
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert not out.exists()


def test_calibration_is_not_part_of_the_run_folder_identity() -> None:
    from robustbench_pid.results.files.run_files import default_out
    from robustbench_pid.run.spec_builder import build_spec

    plain = build_spec("deit", attack="fgsm", dry_run=True)
    priced = build_spec("deit", attack="fgsm", dry_run=True, calibration=(1000, 500))
    assert priced.calibration == (1000.0, 500.0)
    assert default_out(plain) == default_out(priced) == default_out(build_spec("deit", attack="fgsm"))


def test_unit_passes_by_attack() -> None:
    import json

    from robustbench_pid.attacks import make_attack
    from robustbench_pid.specs import Unit
    from robustbench_pid.run.dryrun import unit_passes

    def passes(name: str, **kw) -> tuple:
        js = json.dumps(make_attack(name, **kw).params(), sort_keys=True)
        return unit_passes(None, Unit("adversarial", name, 0.01, js, "", 0, 10, "k"))

    assert unit_passes(None, Unit("adversarial", "clean", 0.0, "{}", "", 0, 10, "k")) == (1, 0)
    assert passes("fgsm", eps=0.01) == (2, 1)  # clean + verdict forward, one gradient
    assert passes("pgd", eps=0.01, steps=20) == (2, 20)
    # attacks whose cost has another shape say so themselves (Attack.passes overrides)
    assert passes("cw", steps=10, search_steps=3) == (2, 30)
    assert passes("spsa", eps=0.01, iterations=5, n_samples=8) == (2 + 5 * 2 * 8, 0)  # +d and -d probes
    assert passes("square", eps=0.01, n_queries=100, restarts=2) == (2 + 200, 0)
    assert passes("autoattack", eps=0.01) == (2 + 5000, 1900)
    assert passes("noise", eps=0.01) == (2, 0)


def test_each_sample_decoded_once_and_records_equal_unit_by_unit(tmp_path: Path, monkeypatch) -> None:
    """Chunk-major scheduling: in a run of 4 conditions (clean, FGSM, PGD, noise) over 2 chunks
    every sample is read and transformed exactly once, and the records equal, bit for bit, those
    of the same units computed one at a time (one process-run per unit, each reading its own
    samples: the per-unit order, which reads every sample once per condition)."""
    from collections import Counter

    from robustbench_pid.data.digits import Digits

    reads: Counter = Counter()
    real = Digits.__getitem__

    def counting(self, i):
        reads[int(i)] += 1
        return real(self, i)

    monkeypatch.setattr(Digits, "__getitem__", counting)
    attacks = [AttackSpec("fgsm", {"eps": 2 / 255}), pgd(2 / 255), AttackSpec("noise", {"eps": 0.1})]
    base = dict(model="deit", attacks=attacks, limit=20, chunk_size=10, batch_size=4, quiet=True)
    a = pd.read_parquet(run(RunSpec(out=tmp_path / "a" / "run", **base)) / "records.parquet")
    assert sorted(reads) == list(range(20)) and set(reads.values()) == {1}
    assert len(a) == 4 * 20 and a.groupby("attack")["sample_id"].nunique().to_dict() == {
        "clean": 20, "fgsm": 20, "noise": 20, "pgd": 20}

    reads.clear()
    n_units = 8
    for i in range(n_units):
        run(RunSpec(out=tmp_path / "b" / "run", shard=f"{i}/{n_units}", **base))
    assert sorted(reads) == list(range(20)) and set(reads.values()) == {4}
    b = pd.read_parquet(tmp_path / "b" / "run" / "records.parquet")
    pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_dry_run_marks_done_units(tmp_path: Path, capsys) -> None:
    spec = RunSpec(model="deit", attacks=[pgd(2 / 255)], limit=20, chunk_size=10, batch_size=10,
                   out=tmp_path / "run", quiet=True)
    run(spec)
    (tmp_path / "run" / "units" / next(iter(sorted((tmp_path / "run" / "units").glob("*.json")))).name).unlink()
    capsys.readouterr()
    spec.dry_run = True
    run(spec)
    statuses = [ln.split()[8] for ln in capsys.readouterr().out.splitlines() if re.match(r"^[0-9a-f]{12}\s", ln)]
    assert sorted(statuses) == ["done", "done", "done", "todo"]


def test_records_do_not_depend_on_global_rng_or_unit_order(tmp_path: Path, monkeypatch) -> None:
    """A benchmark step that draws from (and reseeds) the global RNGs, as AutoAttack does, still
    gives each unit the same records whatever ran before it in the process."""
    from robustbench_pid.benchmarks import adversarial

    real = adversarial.Adversarial.run_unit

    def probing(self, ctx, unit):
        df = real(self, ctx, unit)
        draws = torch.rand(len(df)).numpy() + np.random.rand(len(df)) + np.array([random.random() for _ in range(len(df))])
        torch.manual_seed(0)  # a library that reseeds the global RNG behind our back
        return df.assign(probe=draws)

    monkeypatch.setattr(adversarial.Adversarial, "run_unit", probing)
    base = dict(model="deit", attacks=[pgd(2 / 255)], limit=40, chunk_size=10, batch_size=10, quiet=True)
    torch.manual_seed(1)
    a = pd.read_parquet(run(RunSpec(out=tmp_path / "a" / "run", **base)) / "records.parquet")
    torch.manual_seed(2)
    np.random.seed(2)
    torch.rand(100)
    run(RunSpec(out=tmp_path / "b" / "run", shard="1/2", **base))  # other units first
    torch.rand(7)
    b = pd.read_parquet(run(RunSpec(out=tmp_path / "b" / "run", shard="0/2", **base)) / "records.parquet")
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert a["probe"].nunique() == len(a)  # the probe really drew random numbers
    # and the run left the caller's python/numpy RNG streams where they were
    random.seed(3)
    np.random.seed(3)
    expect = (random.random(), np.random.rand())
    random.seed(3)
    np.random.seed(3)
    run(RunSpec(out=tmp_path / "c" / "run", **base))
    assert (random.random(), np.random.rand()) == expect


def test_dataloader_workers_give_identical_records(tmp_path: Path) -> None:
    base = dict(model="deit", attacks=[pgd(2 / 255)], limit=30, chunk_size=10, batch_size=8, quiet=True)
    a = pd.read_parquet(run(RunSpec(out=tmp_path / "a" / "run", **base)) / "records.parquet")
    b = pd.read_parquet(run(RunSpec(out=tmp_path / "b" / "run", num_workers=2, **base)) / "records.parquet")
    pd.testing.assert_frame_equal(a, b, check_exact=True)


@pytest.mark.parametrize("kw,needle", [
    (dict(batch_size=0, device="cpu"), "needs a GPU"),  # on the CPU, explicitly: fine on a GPU
    (dict(precision="fp16", device="cpu"), "needs a CUDA device"),
    (dict(precision="fp8"), "unknown precision"),
    (dict(num_workers=-1), "--workers"),
    (dict(shard="3/2"), "--shard"),
    (dict(device="cuda:0"), "CUDA is not available"),
])
def test_impossible_settings_fail_clearly(kw, needle, tmp_path: Path) -> None:
    if "cuda" in str(kw.get("device", "")) and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(UserError, match=re.escape(needle)):
        prepare(RunSpec(model="deit", out=tmp_path / "x", **kw))
    assert not (tmp_path / "x").exists()


def test_atomic_writes_and_stale_temp_cleanup(tmp_path: Path) -> None:
    df = pd.DataFrame({"a": [1, 2, 3]})
    write_parquet_atomic(df, tmp_path / "x.parquet")
    assert [p.name for p in tmp_path.iterdir()] == ["x.parquet"]
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "x.parquet"), df)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = os.uname().nodename
    (tmp_path / f".y.parquet.{host}.{dead.pid}.aaaa.tmp").write_bytes(b"partial")  # writer is dead
    (tmp_path / f".z.parquet.{host}.{os.getpid()}.bbbb.tmp").write_bytes(b"partial")  # writer alive (us)
    (tmp_path / f".w.parquet.otherhost.{dead.pid}.cccc.tmp").write_bytes(b"partial")  # can't tell: keep
    assert clean_stale_temps(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["x.parquet", f".z.parquet.{host}.{os.getpid()}.bbbb.tmp", f".w.parquet.otherhost.{dead.pid}.cccc.tmp"])


def test_gpu_of_each_process(monkeypatch) -> None:
    """torchrun's LOCAL_RANK (or Slurm's SLURM_LOCALID) picks the process's GPU (CUDA faked)."""
    from robustbench_pid.runtime import device as dev

    picked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: picked.append(i))
    for k in ("LOCAL_RANK", "SLURM_LOCALID"):
        monkeypatch.delenv(k, raising=False)
    assert dev.pick_device("auto") == torch.device("cuda", 0)
    monkeypatch.setenv("SLURM_LOCALID", "2")
    assert dev.pick_device("auto") == torch.device("cuda", 2)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert dev.pick_device("auto") == torch.device("cuda", 3) == dev.pick_device("cuda")
    assert dev.pick_device("cuda:5") == torch.device("cuda", 5)  # explicit index wins
    assert picked == [0, 2, 3, 3, 5]
    monkeypatch.setenv("LOCAL_RANK", "8")
    with pytest.raises(UserError, match="nproc_per_node 8"):
        dev.pick_device("auto")
