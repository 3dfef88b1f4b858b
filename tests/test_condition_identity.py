"""A number carries what was measured: settings in records, summaries, tables and checks (CPU).

The scenario of the bug report: PGD-20 and PGD-2 runs of two models in one results folder. The
table must never pair PGD-20 of one model with PGD-2 of the other, and `check` must not take a
weaker attack for an improvement.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from robustbench_pid.attacks import make_attack
from robustbench_pid.results.ci.check import check, update
from robustbench_pid.results.store import load_records, load_results
from robustbench_pid.run.runner import run
from robustbench_pid.specs import AttackSpec, RunSpec
from robustbench_pid.results.tables.render import render
from robustbench_pid.results.tables.layouts import paper_tables

PGD20 = "PGD-20 (step 2.5·eps/20, random start, early stop top-5)"
PGD2 = "PGD-2 (step 2.5·eps/2, random start, early stop top-5)"


def _run(out: Path, model: str, steps: int, limit: int = 48, **kw) -> Path:
    a = make_attack("pgd", eps=4 / 255, steps=steps)
    spec = RunSpec(model=model, attacks=[AttackSpec("pgd", a.params())], limit=limit, batch_size=48,
                   out=out, quiet=True, device="cpu", **kw)
    return run(spec)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity")
    return {(m, s): _run(root / "results" / f"{m}-pgd{s}", m, s) for m in ("deit", "pid_deit") for s in (20, 2)}


def test_records_and_summary_carry_the_settings(runs):
    rec = load_records(runs[("pid_deit", 20)])
    pgd = rec[rec["attack"] == "pgd"]
    assert set(pgd["setting"]) == {PGD20} and pgd["settings_id"].nunique() == 1
    assert set(pgd["precision"]) == {"fp32"}
    summary = pd.read_csv(runs[("pid_deit", 20)] / "summary.csv")
    row = summary[(summary["attack"] == "pgd") & (summary["metric"] == "top1")].iloc[0]
    assert row["setting"] == PGD20 and len(row["settings_id"]) == 12 and len(row["samples_id"]) == 12
    other = pd.read_csv(runs[("pid_deit", 2)] / "summary.csv")
    row2 = other[(other["attack"] == "pgd") & (other["metric"] == "top1")].iloc[0]
    assert row2["setting"] == PGD2 and row2["settings_id"] != row["settings_id"]
    assert row2["samples_id"] == row["samples_id"]  # same 48 samples
    # clean has one identity whatever the attack run beside it
    clean = summary[summary["attack"] == "clean"]["settings_id"].iloc[0]
    assert clean == other[other["attack"] == "clean"]["settings_id"].iloc[0]


def test_paper_table_never_pairs_different_attacks(runs):
    # one PGD-20 run and one PGD-2 run of different models: no common setting, so no Δ between them
    t = paper_tables([runs[("pid_deit", 20)], runs[("deit", 2)]], models=["deit", "pid_deit"])[0]
    pgd = t.frame[t.frame["Attack"].str.startswith("PGD")]
    assert set(pgd["Attack"]) == {"PGD (4/255) · steps 2", "PGD (4/255) · steps 20"}
    top1 = t.frame[(t.frame["Metric"] == "Top-1 Acc (%) [95% Wilson]")]
    for _, r in top1[top1["Attack"].str.startswith("PGD")].iterrows():
        assert "-" in (r["deit"], r["pid_deit"])  # each setting row has one model only
        assert r["Δ pid_deit−deit"] == "-" and r["p pid_deit vs deit"] == "n/a"
    assert any(n.startswith("settings: ") and PGD20 in n and PGD2 in n for n in t.notes)
    # the clean row is the same condition for both: paired as before
    clean = top1[top1["Attack"] == "Clean"].iloc[0]
    assert clean["Δ pid_deit−deit"] != "-"


def test_paper_table_with_both_settings_pairs_within_each(runs):
    text = render(paper_tables(list(runs.values()), models=["deit", "pid_deit"]), "markdown")
    t = paper_tables(list(runs.values()), models=["deit", "pid_deit"])[0]
    top1 = t.frame[t.frame["Metric"] == "Top-1 Acc (%) [95% Wilson]"].set_index("Attack")
    s20 = load_results(runs[("pid_deit", 20)])
    d20 = load_results(runs[("deit", 20)])

    def acc(df):
        return float(df[(df["attack"] == "pgd") & (df["metric"] == "top1")]["value"].iloc[0])

    row = top1.loc["PGD (4/255) · steps 20"]
    assert row["pid_deit"].startswith(f"{acc(s20):.2f}") and row["deit"].startswith(f"{acc(d20):.2f}")
    assert row["Δ pid_deit−deit"] == f"{acc(s20) - acc(d20):+.2f}"
    assert "PGD (4/255) · steps 2 " in text or "PGD (4/255) · steps 2 |" in text


def test_check_fails_on_a_weaker_attack_naming_the_setting(runs, tmp_path, capsys):
    base = tmp_path / "base.csv"
    update(runs[("pid_deit", 20)], base)
    weaker = check(runs[("pid_deit", 2)], base, tolerance=100.0)  # any tolerance: a changed attack still fails
    assert not weaker.ok
    row = weaker.rows[(weaker.rows["attack"] == "pgd") & (weaker.rows["metric"] == "top1")].iloc[0]
    assert row["status"] == "SETTINGS-CHANGED" and "steps: 20 → 2" in row["changes"]
    assert row["new"] >= row["old"]  # the weaker attack looks like an "improvement" by value
    report = weaker.report()
    assert "SETTINGS-CHANGED: pid_deit digits pgd eps=4/255 top1: steps: 20 → 2" in report
    assert "--update" in report and report.endswith("FAILED")
    # the same command passes against itself, and --update accepts the change on purpose
    assert check(runs[("pid_deit", 20)], base).ok
    update(runs[("pid_deit", 2)], base)
    assert check(runs[("pid_deit", 2)], base).ok


def test_check_cli_exit_code_and_message(runs, tmp_path, capsys):
    from robustbench_pid.cli import main

    base = tmp_path / "b.csv"
    assert main(["check", str(runs[("deit", 20)]), "--baseline", str(base), "--update"]) == 0
    capsys.readouterr()
    assert main(["check", str(runs[("deit", 2)]), "--baseline", str(base), "--tolerance", "50"]) == 1
    out = capsys.readouterr().out
    assert "SETTINGS-CHANGED" in out and "steps: 20 → 2" in out


def test_old_baseline_without_settings_still_works_with_a_warning(runs, tmp_path):
    base = tmp_path / "base.csv"
    update(runs[("deit", 20)], base)
    old = pd.read_csv(base).drop(columns=["setting", "settings_id", "samples_id", "settings", "device", "precision",
                                          "versions"])
    old.to_csv(base, index=False)
    res = check(runs[("deit", 20)], base)
    assert res.ok and any("predates recorded settings" in n for n in res.notes)
    assert set(res.rows["status"]) == {"ok"}


def test_changed_sample_set_fails_and_compares_on_shared_samples(runs, tmp_path):
    base = tmp_path / "base.csv"
    update(runs[("deit", 20)], base)
    small = _run(tmp_path / "small", "deit", 20, limit=32)
    res = check(small, base, tolerance=100.0)
    assert not res.ok
    row = res.rows[(res.rows["attack"] == "clean") & (res.rows["metric"] == "top1")].iloc[0]
    assert row["status"] == "SAMPLES-CHANGED" and "n 48 → 32" in row["changes"]
    assert "32 samples both have" in row["changes"]
    # the first 32 samples, unchanged model: identical on the shared samples
    assert row["old"] == pytest.approx(row["new"])


def test_cross_device_baseline_fails_only_on_significant_drops(runs, tmp_path):
    base = tmp_path / "base.csv"
    update(runs[("deit", 20)], base)
    df = pd.read_csv(base)
    df["device"] = "cuda"
    m = (df["attack"] == "pgd") & (df["metric"] == "top1")
    df.loc[m, "value"] += 100 / 48  # one sample better on the "GPU"
    df.to_csv(base, index=False)
    res = check(runs[("deit", 20)], base, tolerance=0.5)
    assert res.ok, res.report()
    row = res.rows[(res.rows["attack"] == "pgd") & (res.rows["metric"] == "top1")].iloc[0]
    assert row["status"] == "within-noise"
    assert any("made on cuda (fp32) and these results on cpu (fp32)" in n for n in res.notes)
    # on the same device the tight tolerance applies
    df["device"] = "cpu"
    df.to_csv(base, index=False)
    assert check(runs[("deit", 20)], base, tolerance=0.5).rows.set_index(["attack", "metric"]).loc[
        ("pgd", "top1"), "status"] == "REGRESSED"


def test_report_names_each_setting(runs, tmp_path):
    from robustbench_pid.results.report.html import write_report

    out = write_report(list(runs.values()), tmp_path / "r.html")
    page = Path(out).read_text()
    assert PGD20 in page and PGD2 in page and "PGD (4/255) · steps 2" in page
