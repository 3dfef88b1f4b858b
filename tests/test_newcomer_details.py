"""The smaller items of issue 46: `check` on a study folder checks its runs (a clean pass every row repeats is one
measurement, two different numbers under one key are still refused), and --chunk-size's help says it seeds the
units' draws."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import robustbench_pid as rbp
from robustbench_pid.cli import main
from robustbench_pid.errors import UserError
from robustbench_pid.results.ci.check import current_rows


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> pd.DataFrame:
    """One model's tidy rows from two runs over the same 4 samples (FGSM, PGD-1), as a study's rows are."""
    root = tmp_path_factory.mktemp("rows")
    for attack in ("fgsm", "pgd"):
        rbp.evaluate(model="deit", attack=attack, eps="2/255", steps=1 if attack == "pgd" else None, limit=4,
                     device="cpu", out=root / attack)
    return rbp.load_results(root)


def test_a_clean_pass_both_runs_repeat_is_checked_once(two_runs: pd.DataFrame) -> None:
    rows = current_rows(two_runs)
    clean = rows[(rows["attack"] == "clean") & (rows["metric"] == "top1")]
    assert len(clean) == 1  # the same samples, model and value: one measurement
    assert set(rows["attack"]) == {"clean", "fgsm", "pgd"}


def test_two_different_numbers_under_one_key_are_still_refused(two_runs: pd.DataFrame) -> None:
    df = two_runs.copy()
    clean = (df["attack"] == "clean") & (df["metric"] == "top1") & (df["run_id"] == "pgd")
    df.loc[clean, "value"] = df.loc[clean, "value"] - 25.0
    with pytest.raises(UserError, match="rows sharing a key"):
        current_rows(df)


def test_check_on_a_study_folder_compares_each_row(tmp_path: Path, capsys) -> None:
    out = tmp_path / "study"
    assert main(["reproduce", "digits-smoke", "--model", "pid_deit", "--only", "clean", "--only", "fgsm-2",
                 "--limit", "4", "--quiet", "--device", "cpu", "--out", str(out)]) == 0
    base = tmp_path / "base.csv"
    assert main(["check", str(out), "--baseline", str(base), "--update"]) == 0
    capsys.readouterr()
    assert main(["check", str(out), "--baseline", str(base)]) == 0
    text = capsys.readouterr().out
    assert "0 regressed" in text and "0 missing" in text
    assert len(pd.read_csv(base).query("attack == 'clean' and metric == 'top1'")) == 1


def test_chunk_size_help_says_it_seeds_the_draws(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "each unit seeds its own random draws, so another chunk size gives randomised attacks" in text
