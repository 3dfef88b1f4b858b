"""`evaluate` end to end through its console script, the results schema, and bad input."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import robustbench_pid as rbp
from robustbench_pid.errors import UserError

BIN = Path(sys.executable).parent


def _evaluate(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("evaluate", path=str(BIN)) or "evaluate"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def pgd_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("e2e")
    p = _evaluate("--model", "pid_deit", "--attack", "pgd", "--limit", "24", "--steps", "5", "--quiet",
                  "--device", "cpu", cwd=cwd)
    assert p.returncode == 0, p.stderr
    assert "wrote results/" in p.stdout
    runs = list((cwd / "results").iterdir())
    assert len(runs) == 1
    (runs[0] / "stdout.txt").write_text(p.stdout)
    return runs[0]


def test_console_script_prints_table_and_writes_folder(pgd_run: Path) -> None:
    out = (pgd_run / "stdout.txt").read_text()
    for eps in ("1/255", "2/255", "3/255", "4/255", "5/255", "6/255"):  # the papers' default sweep
        assert f"pgd {eps}" in " ".join(out.split())
    assert "clean" in out and "top1" in out and "top5" in out
    for f in ("records.parquet", "summary.csv", "run.json"):
        assert (pgd_run / f).is_file()
    info = json.loads((pgd_run / "run.json").read_text())
    assert info["status"] == "complete" and info["limit"] == 24 and info["n_samples"] == 24
    assert info["protocol"] == "standard" and info["dataset"] == "digits" and info["split"] == "test"
    assert info["arch_kwargs"]["pid"]["lambda_p"] == 0.8
    assert len(info["checkpoint_sha256"]) == 64 and info["device"] == "cpu"
    assert {a["eps"] for a in info["attacks"]} == {i / 255 for i in range(1, 7)}
    assert all(a["steps"] == 5 for a in info["attacks"])
    for k in ("seed", "versions", "git_commit", "wall_seconds", "precision"):
        assert k in info


def test_load_results_schema_and_values(pgd_run: Path) -> None:
    df = rbp.load_results(pgd_run)
    for col in ("run_id", "model", "checkpoint_sha256", "dataset", "protocol", "attack", "eps", "metric",
                "value", "n", "ci_low", "ci_high"):
        assert col in df.columns
    # accuracy, plus the evidence that each attack worked (docs/attacks.md): passes and the indicators
    # the telemetry decides without --indicators
    # incomplete optimisation is computed by default (issue 31: it costs no pass)
    assert set(df["metric"]) == {"top1", "top5", "passes_forward", "passes_backward", "silent_success",
                                 "unavailable_gradients", "incomplete_optimization"}
    n_rows = len(df)
    df = df[df["metric"].isin(["top1", "top5"])]
    clean = df[(df.attack == "clean")]
    assert set(clean["eps"]) == {0.0} and set(clean["n"]) == {24}
    rec = rbp.load_records(pgd_run)
    assert len(rec) == 24 * 7
    for _, row in df.iterrows():
        g = rec[(rec.attack == row.attack) & (rec.eps == row.eps)]
        assert row.value == pytest.approx(100 * g[f"correct_{row.metric}"].mean())
        assert row.ci_low <= row.value <= row.ci_high
    pgd = df[(df.attack == "pgd") & (df.metric == "top1")].sort_values("eps")
    assert list(pgd["value"]) == sorted(pgd["value"], reverse=True)  # non-increasing in eps
    # robust => clean-correct (worst case over the ball), and perturbations stay in the ball
    adv = rec[rec.attack == "pgd"]
    assert not (adv.correct_top1 & ~adv.clean_correct_top1).any()
    assert (adv.pert_linf <= adv.eps + 1e-6).all()
    # a folder of runs works too
    assert len(rbp.load_results(pgd_run.parent)) == n_rows


@pytest.mark.parametrize("args,needle", [
    (["--model", "deit", "--attack", "pgd", "--eps", "abc"], "malformed eps"),
    (["--model", "deit", "--attack", "pgd", "--eps=-1/255"], ">= 0"),
    (["--model", "deit", "--attack", "pgd", "--eps", "1.5"], "exceeds"),
    (["--model", "nope", "--attack", "pgd"], "Valid models:"),
    (["--model", "deit", "--attack", "pgx"], "Valid attacks:"),
    (["--model", "deit", "--dataset", "mnist", "--attack", "pgd"], "Valid datasets:"),
    (["--model", "deit", "--attack", "pgd", "--out", "/proc/forbidden/run"], "cannot write"),
])
def test_bad_input_fails_before_any_work(tmp_path: Path, args: list, needle: str) -> None:
    p = _evaluate(*args, "--quiet", cwd=tmp_path)
    assert p.returncode == 2
    assert needle in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "results").exists()


def test_run_that_dies_leaves_no_complete_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from robustbench_pid.benchmarks import adversarial
    from robustbench_pid.cli import evaluate as ev

    calls = {"n": 0}
    real = adversarial.Adversarial.run_unit

    def dying(self, ctx, unit):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated crash")
        return real(self, ctx, unit)

    monkeypatch.setattr(adversarial.Adversarial, "run_unit", dying)
    out = tmp_path / "run"
    import argparse

    parser = argparse.ArgumentParser()
    ev.add_arguments(parser)
    args = parser.parse_args(["--model", "deit", "--attack", "fgsm", "--eps", "2/255", "--limit", "8",
                              "--quiet", "--out", str(out)])
    with pytest.raises(RuntimeError, match="simulated"):
        ev.run(args)
    assert not (out / "summary.csv").exists() and not (out / "records.parquet").exists()
    assert json.loads((out / "run.json").read_text())["status"] == "running"
    with pytest.raises(UserError, match="not complete"):
        rbp.load_results(out)
    # re-running the same command finishes it
    monkeypatch.setattr(adversarial.Adversarial, "run_unit", real)
    ev.run(args)
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    assert set(rbp.load_results(out)["attack"]) == {"clean", "fgsm"}
