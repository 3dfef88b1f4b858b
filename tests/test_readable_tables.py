"""Tables a person can read (issue 46, item 3): models as columns, comparisons only for the pairs asked for (a
study's claims, a named baseline, or the one pair of two models), cells of different n saying so, labels that name
the attack's settings and the interval's kind, no line wider than 200 characters by default, and a study's table
showing the rows that ran with one line naming the rest."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
import torch

from robustbench_pid.cli import main
from robustbench_pid.results.tables.render import WIDTH, column_groups

ZOO = ["deit", "fan", "featscale_deit", "pid_deit", "pid_fan", "pid_featscale_deit", "rpc_deit", "rpc_fan",
       "rpc_symasym_deit", "rpc_symvit", "rpc_symvit_all", "symfan", "symvit"]  # README's 13 embedded models


@pytest.fixture(scope="module")
def zoo_runs(tmp_path_factory) -> Path:
    """The 13 zoo models on 4 digits (pid_deit on 8): clean, FGSM 3/255 and PGD-2 4/255, one run folder each."""
    from robustbench_pid.run.runner import run
    from robustbench_pid.specs import AttackSpec, RunSpec

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("zoo")
    attacks = [AttackSpec("fgsm", {"eps": 3 / 255}),
               AttackSpec("pgd", {"eps": 4 / 255, "steps": 2, "step_size": None, "step_size_factor": None,
                                  "random_start": True, "early_stop": True, "stop_topk": 5})]
    try:
        for m in ZOO:
            run(RunSpec(model=m, attacks=attacks, limit=8 if m == "pid_deit" else 4, batch_size=8, quiet=True,
                        out=root / m))
    finally:
        torch.set_num_threads(n)
    return root


def _table(capsys, *args: str) -> str:
    assert main(["table", *args]) == 0
    return capsys.readouterr().out


def test_thirteen_models_fit_200_characters_and_compare_nothing_unasked(zoo_runs: Path, capsys) -> None:
    out = _table(capsys, str(zoo_runs))
    widths = [len(ln) for ln in out.splitlines()]
    assert max(widths) <= WIDTH, max(widths)
    headers = [ln for ln in out.splitlines() if ln.startswith("| Attack | Metric |")]
    assert len(headers) > 1  # the table continues below in parts, each repeating the row names
    named = [c.strip() for ln in headers for c in ln.split("|")[3:-1]]
    assert named == ZOO  # every model a column, once, in order
    assert "Δ" not in " ".join(headers)
    assert "Δ and p: none shown for 13 models (78 pairs); name the comparisons with --baseline MODEL" in \
        " ".join(out.split())
    # labels: the attack's settings and the interval's kind
    assert "| PGD-2 (4/255) | Top-1 Acc (%) [95% Wilson] |" in out
    # pid_deit ran 8 samples, the others 4: every cell of those rows says its n
    row = next(ln for ln in out.splitlines() if ln.startswith("| Clean | Top-1") and "n=" in ln)
    assert re.search(r"n=4 \|", row) and ("n=8" in out)


def test_a_baseline_gives_one_pair_per_model_and_deltas_on_shared_samples(zoo_runs: Path, capsys) -> None:
    out = _table(capsys, str(zoo_runs), "--baseline", "deit")
    heads = " ".join(ln for ln in out.splitlines() if ln.startswith("| Attack"))
    assert sorted(re.findall(r"Δ (\w+)−deit", heads)) == sorted(m for m in ZOO if m != "deit")
    assert max(len(ln) for ln in out.splitlines()) <= WIDTH
    # a Δ and its p always stand in the same part of the wrapped table
    for ln in out.splitlines():
        if ln.startswith("| Attack"):
            cols = [c.strip() for c in ln.split("|")[1:-1]]
            for i, c in enumerate(cols):
                if c.startswith("Δ "):
                    assert cols[i + 1].startswith("p "), ln
    # pid_deit (8) vs deit (4): Δ on the 4 shared samples, and it says so
    assert re.search(r"\| [+-]\d+\.\d\d \(n=4\) \|", out)
    assert "Δ and p with (n=…) are on the samples both runs have" in " ".join(out.split())


def test_pairs_pick_the_comparisons_and_bad_ones_are_one_error(zoo_runs: Path, capsys) -> None:
    out = _table(capsys, str(zoo_runs), "--pairs", "deit:pid_deit,symvit:rpc_symvit")
    heads = " ".join(ln for ln in out.splitlines() if ln.startswith("| Attack"))
    assert re.findall(r"Δ \S+", heads) == ["Δ pid_deit−deit", "Δ rpc_symvit−symvit"]
    for bad, says in ((["--pairs", "deit:nope"], "model 'nope' (--baseline/--pairs) is not in the table"),
                      (["--pairs", "deit"], "expected BASELINE:MODEL"),
                      (["--pairs", "deit:fan", "--baseline", "deit"], "give --pairs or --baseline, not both"),
                      (["--width", "10"], "at least 40 characters")):
        assert main(["table", str(zoo_runs), *bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and says in err[0], err


def test_width_zero_or_a_file_keeps_one_wide_table(zoo_runs: Path, capsys, tmp_path: Path) -> None:
    out = _table(capsys, str(zoo_runs), "--width", "0")
    assert len([ln for ln in out.splitlines() if ln.startswith("| Attack")]) == 1
    assert max(len(ln) for ln in out.splitlines()) > WIDTH
    f = tmp_path / "t.md"
    assert main(["table", str(zoo_runs), "-o", str(f)]) == 0
    assert f"wrote {f}" in capsys.readouterr().out
    assert len([ln for ln in f.read_text().splitlines() if ln.startswith("| Attack")]) == 1


def test_two_models_are_compared_without_asking(zoo_runs: Path, capsys) -> None:
    out = _table(capsys, str(zoo_runs / "deit"), str(zoo_runs / "symvit"))
    assert "Δ symvit−deit" in out and "p symvit vs deit" in out


def test_column_groups_keep_keys_and_glued_columns() -> None:
    grid = [["Attack", "Metric", "a", "b", "Δ b−a", "p b vs a", "c"]] + [["x" * 10, "y" * 10] + ["z" * 30] * 5]
    parts = column_groups(grid, 2, 90, glued=(5,))
    assert all(p[:2] == [0, 1] for p in parts)
    assert sorted(i for p in parts for i in p[2:]) == [2, 3, 4, 5, 6]  # every column once
    assert any(4 in p and 5 in p for p in parts)  # the p stays with its Δ
    assert column_groups(grid, 2, None) == [list(range(7))]


def test_the_summary_names_settings_and_the_interval(zoo_runs: Path) -> None:
    from robustbench_pid.results.report.evidence_text import format_evidence
    from robustbench_pid.results.report.report_text import format_summary

    summary = pd.read_csv(zoo_runs / "deit" / "summary.csv")
    text = format_summary(summary)
    assert text.startswith("top1 / top5: accuracy in % [95% Wilson interval]; n: samples")
    assert "  pgd = PGD-2 (step 2.5·eps/2, random start, early stop top-5)" in text and "fgsm = FGSM" not in text
    head = format_evidence(summary).splitlines()[0]
    shown = ("silent", "incomplete", "no-grad")
    assert all(k in head for k in shown) and "unconstrained, unstable, transfer need --indicators" in head


def test_a_study_table_shows_the_rows_asked_for_and_one_line_for_the_rest(tmp_path: Path, capsys) -> None:
    from robustbench_pid.studies.spec import load_study

    out = tmp_path / "s"
    assert main(["reproduce", "digits-smoke", "--model", "pid_deit", "--only", "clean", "--limit", "4", "--quiet",
                 "--device", "cpu", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    others = [r.name for r in load_study("digits-smoke").rows if r.name != "clean"]
    body = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("|  | metric")]
    assert [ln.split("|")[1].strip() for ln in body if ln.split("|")[1].strip()] == ["Clean"]
    assert "not run (or not finished)" not in text
    excluded = [ln for ln in text.splitlines() if "not run (left out with --only/--skip" in ln]
    assert len(excluded) == 1 and excluded[0].endswith(", ".join(others))
    assert max(len(ln) for ln in text.splitlines()) <= WIDTH
    csv = pd.read_csv(out / "table.csv")  # the machine-readable table keeps every row
    assert set(csv.row) == {r.name for r in load_study("digits-smoke").rows}
