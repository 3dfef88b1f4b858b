"""0% and 100%: a run where every sample is broken and one where every sample survives go through
``table``, ``plot`` (eps curves and accuracy against cost) and ``report`` without a traceback, and
every accuracy's interval contains its point, exactly 0 below 0% and exactly 100 above 100% (issue 33)."""
from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest

import robustbench_pid as rbp
from robustbench_pid.cli import main


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("all_or_none")
    # issue 33's command: PGD-20 at 32/255 breaks all 48 (and the unconstrained condition --indicators adds)
    rbp.evaluate(model="deit", attack="pgd", eps=["32/255"], limit=48, indicators=True, out=str(root / "broken"),
                 quiet=True)
    # the first 15 digits are all classified correctly and a 0.1/255 PGD-5 moves none of them
    rbp.evaluate(model="deit", attack="pgd", eps=["0.1/255"], steps=5, limit=15, out=str(root / "survive"),
                 quiet=True)
    return {"broken": root / "broken", "survive": root / "survive"}


def _accuracies(run: Path) -> pd.DataFrame:
    t = rbp.load_results(run)
    return t[t["metric"].isin(["top1", "top5"])]


def test_the_two_runs_are_all_or_none(runs):
    broken, survive = _accuracies(runs["broken"]), _accuracies(runs["survive"])
    attacked = broken[(broken["attack"] == "pgd") & (broken["metric"] == "top1")]
    assert len(attacked) == 2 and (attacked["value"] == 0.0).all()  # 32/255 and the unconstrained condition
    assert (survive["value"] == 100.0).all() and set(survive["attack"]) == {"clean", "pgd"}


@pytest.mark.parametrize("name", ["broken", "survive"])
def test_intervals_contain_their_points_with_exact_ends(runs, name):
    acc = _accuracies(runs[name])
    assert ((acc["ci_low"] <= acc["value"]) & (acc["value"] <= acc["ci_high"])).all(), acc
    assert (acc.loc[acc["value"] == 0.0, "ci_low"] == 0.0).all()
    assert (acc.loc[acc["value"] == 100.0, "ci_high"] == 100.0).all()
    assert (acc["value"].isin([0.0, 100.0])).any()


@pytest.mark.parametrize("which", [["broken"], ["survive"], ["broken", "survive"]])
def test_table_plot_and_report_show_them(runs, which, tmp_path, capsys):
    folders = [str(runs[w]) for w in which]
    if len(which) == 1:
        assert main(["table", *folders]) == 0
        out = capsys.readouterr().out
        assert ("0.00 [0.0, 7.4]" if which == ["broken"] else "100.00 [79.6, 100.0]") in out  # 0/48, 15/15
    else:  # every condition of both, as numbers
        assert main(["table", *folders, "--layout", "long", "--format", "csv"]) == 0
        t = pd.read_csv(io.StringIO(capsys.readouterr().out))
        acc = t[t["metric"].astype(str).str.contains("top", case=False)]
        v, lo, hi = (pd.to_numeric(acc[c], errors="coerce") for c in ("value", "ci_low", "ci_high"))
        assert len(acc) and ((lo <= v) & (v <= hi)).all(), acc
        assert (lo[v == 0] == 0).all() and (hi[v == 100] == 100).all() and (v == 0).any() and (v == 100).any()
    assert main(["plot", *folders, "--out", str(tmp_path / "plots")]) == 0
    drawn = {p.name for p in (tmp_path / "plots").iterdir()}
    assert {"accuracy_vs_cost.png", "eps_curves_top1.png", "eps_curves_top5.png"} <= drawn, drawn
    assert main(["report", *folders, "-o", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "accuracy" in page.lower() and "Traceback" not in page
    assert "Traceback" not in capsys.readouterr().err


def test_the_python_plot_functions_take_them(runs, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from robustbench_pid.results.report.plots import plot_accuracy_vs_cost

    both = pd.concat([rbp.load_results(runs["broken"]), rbp.load_results(runs["survive"])], ignore_index=True)
    assert plot_accuracy_vs_cost(both) is not None
    assert rbp.plot_eps_curves(both) is not None
