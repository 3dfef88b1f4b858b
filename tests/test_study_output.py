"""What a study prints (issue 54): one screen for a one-row study of every column, rows left out with --only named
once for the whole study, and rows that were asked for but did not finish named per claim (they are news)."""
from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import List, Tuple

import pytest

from robustbench_pid.cli import main
from robustbench_pid.studies.spec import load_study

# README's next command, as a newcomer runs it (--out: a temporary folder instead of results/)
COMMAND = ["reproduce", "claims-digits", "--all-columns", "--only", "clean", "--limit", "8", "--quiet"]
MAX_LINES = 60


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, List[str]]:
    """The exact command, run once for this module: its study folder and its terminal output (stdout, stderr)."""
    folder = tmp_path_factory.mktemp("claims") / "study"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main([*COMMAND, "--out", str(folder)]) == 0
    return folder, (out.getvalue() + err.getvalue()).splitlines()


@pytest.fixture()
def printed(ran: Tuple[Path, List[str]]) -> List[str]:
    return ran[1]


@pytest.fixture()
def clean_study(ran: Tuple[Path, List[str]]) -> Path:
    return ran[0]


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "study"
    shutil.copytree(src, dst)
    return dst


def test_the_quiet_one_row_study_of_every_column_fits_one_screen(printed: List[str]) -> None:
    study = load_study("claims-digits")
    assert len(printed) <= MAX_LINES, "\n".join(printed)
    text = "\n".join(printed)
    # the rows left out with --only: one line (wrapped) for the whole study, naming each of them
    left = [i for i, ln in enumerate(printed) if ln.startswith("- not run (left out with --only/--skip")]
    assert len(left) == 1
    named = " ".join(printed[left[0]:left[0] + 2])
    assert all(r.name in named for r in study.rows if r.name != "clean")
    assert "not run (or not finished)" not in text and "no paired value" not in text  # nothing was asked and lost
    # a line per column (the table turned: 15 columns, one row) and a line per claim, each with the clean row
    assert sum(ln.startswith("| ") and "(" in ln and ", paper) |" in ln for ln in printed) == len(study.columns)
    claims = [ln for ln in printed if ln.startswith("| ") and "| Clean |" in ln]
    assert [ln.split("|")[1].strip() for ln in claims] == [p.claim for p in study.pairs]
    assert not any("|---|" in ln and ln.count("|") > 10 for ln in printed)  # no part of a wrapped 15-column table
    assert printed[-1].startswith("wrote ")


def test_a_row_asked_for_that_did_not_finish_is_named_once_for_its_claim(clean_study: Path, tmp_path: Path) -> None:
    """One column's clean run killed midway (run.json still 'running'): the table names the column and the row,
    the claim it belongs to names them in one line, and claims that have both runs say nothing."""
    from robustbench_pid.studies.table import write_study_table

    out = _copy(clean_study, tmp_path)
    run = out / "pid_deit@PID-DeiT" / "paper" / "clean" / "run.json"
    info = json.loads(run.read_text())
    run.write_text(json.dumps({**info, "status": "running"}))
    lines = write_study_table(out).splitlines()
    table = [ln for ln in lines if "pid_deit as 'PID DeiT', paper protocol: row(s) clean not run (or not finished)"
             in ln]
    assert len(table) == 1
    gaps = [ln for ln in lines if "no paired value" in ln]
    assert gaps == ["- PID DeiT is more robust than softmax DeiT: no paired value at paper protocol row(s) clean: "
                    "not run (or not finished) for 'PID DeiT'"]
    assert sum("not run (left out with --only/--skip" in ln for ln in lines) == 1
    assert (out / "pairs.md").read_text().count("no paired value") == 1


def test_a_row_one_side_of_a_claim_ran_names_the_other_side_only_for_that_claim(clean_study: Path,
                                                                               tmp_path: Path, capsys) -> None:
    """pid_deit asked for fgsm-1 too: the claim PID DeiT vs DeiT lacks DeiT's fgsm-1 (one line); the claims whose
    columns nobody asked for fgsm-1 say nothing, and fgsm-1 is no longer among the rows left out."""
    out = _copy(clean_study, tmp_path)
    assert main(["reproduce", "claims-digits", "--model", "pid_deit", "--only", "clean", "--only", "fgsm-1",
                 "--limit", "8", "--quiet", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) <= MAX_LINES, "\n".join(lines)
    gaps = [ln for ln in lines if "no paired value" in ln]
    assert gaps == ["- PID DeiT is more robust than softmax DeiT: no paired value at paper protocol row(s) fgsm-1: "
                    "not run (or not finished) for 'DeiT'"]
    left = next(i for i, ln in enumerate(lines) if ln.startswith("- not run (left out with --only/--skip"))
    assert "fgsm-1," not in " ".join(lines[left:left + 2]) and "fgsm-2" in lines[left]
    pid = next(ln for ln in lines if ln.startswith("| PID DeiT (pid_deit, paper) |"))
    assert pid.count("[") == 2  # its clean and fgsm-1 values, on its own line


def test_an_all_columns_run_says_its_column_on_each_row_line(tmp_path: Path, capsys) -> None:
    """README's claims command without --quiet: each row's start line names its column (no line of its own)."""
    assert main(["reproduce", "claims-digits", "--all-columns", "--only", "clean", "--limit", "4", "--device", "cpu",
                 "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out.splitlines()
    study = load_study("claims-digits")
    starts = [ln for ln in out if "[1/1] row 'clean' (Clean)" in ln]
    assert [ln.split(":")[0] for ln in starts] == [f"column {k + 1}/{len(study.columns)} {c.name!r} ({c.model})"
                                                   for k, c in enumerate(study.columns)]
    assert not any(ln.startswith("==") for ln in out)


def test_a_condition_several_runs_hold_is_one_note_for_every_model() -> None:
    """`table results/` after README's studies: the clean pass of 15 models is in several runs each; one note says
    which run each model's value is shown from (it was one note, two lines wide, per model)."""
    import pandas as pd

    from robustbench_pid.results.inputs import KEY, dedupe

    rows = []
    for model in ("deit", "pid_deit", "fan"):
        for run, n in ((f"{model}-clean", 8), (f"{model}-pgd", 16)):
            rows.append({"label": model, "dataset": "digits", "protocol": "paper", "benchmark": "adversarial",
                         "attack": "clean", "eps_key": 0.0, "settings_id": "s", "metric": "top1", "condition": "",
                         "n": n, "run_id": run, "norm": "", "value": 90.0})
    df = pd.DataFrame(rows)
    out, notes = dedupe(df)
    assert len(out) == 3 and set(out["run_id"]) == {"deit-pgd", "pid_deit-pgd", "fan-pgd"}  # the most samples
    assert notes == ["clean: identical settings in several runs; shown from the run with the most samples (then the "
                     "last run id): deit from deit-pgd, pid_deit from pid_deit-pgd, fan from fan-pgd"]
    assert len(out.drop_duplicates(KEY)) == len(out)
