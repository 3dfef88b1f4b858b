"""Robust accuracy against attack cost (issue 26): the iterative attacks' top-1 drawn against the passes each
attacked sample cost, one point per setting, from the evidence rows of summary.csv; one-pass attacks left out."""
from __future__ import annotations

import pandas as pd

import robustbench_pid as rbp
from robustbench_pid.results.report.plots import plot_accuracy_vs_cost, write_plots


def test_pgd_steps_drawn_against_their_passes(tmp_path) -> None:
    for steps in (2, 6):
        rbp.evaluate(model="pid_deit", attack="pgd", eps=["4/255"], steps=steps, limit=16,
                     param={"early_stop": "false"}, out=str(tmp_path / f"pgd{steps}"), quiet=True)
    rbp.evaluate(model="pid_deit", attack="fgsm", eps=["4/255"], limit=16, out=str(tmp_path / "fgsm"), quiet=True)
    df = rbp.load_results(tmp_path)
    fig = plot_accuracy_vs_cost(df)
    assert fig is not None
    (ax,) = [a for a in fig.axes if a.get_visible()]
    (bars,) = [c for c in ax.containers if c.get_label() == "pid_deit · pgd"]
    x, y = list(bars.lines[0].get_xdata()), list(bars.lines[0].get_ydata())
    # PGD-k without early stop: k + 1 forward (the verdict included) + k backward passes per attacked sample
    assert x == [2 * 2 + 1, 2 * 6 + 1]
    pgd = df[df["attack"] == "pgd"]
    want = [pgd[(pgd["metric"] == "top1") & (pgd["run_id"] == f"pgd{k}")]["value"].item() for k in (2, 6)]
    assert y == want
    assert [c.get_label() for c in ax.containers] == ["pid_deit · pgd"]  # one-pass attacks (FGSM) left out
    paths, notes = write_plots(df, tmp_path / "plots", formats=("png",))
    assert tmp_path / "plots" / "accuracy_vs_cost.png" in paths


def test_no_iterative_attack_no_figure(tmp_path) -> None:
    rbp.evaluate(model="deit", attack="fgsm", eps=["2/255"], limit=8, out=str(tmp_path / "r"), quiet=True)
    assert plot_accuracy_vs_cost(rbp.load_results(tmp_path)) is None
    assert pd.Series(write_plots(tmp_path, tmp_path / "p", formats=("png",))[1]).str.startswith("accuracy_vs_cost").any()


def test_the_standard_and_the_paper_protocol_are_never_one_line(tmp_path) -> None:
    """PGD in the two protocols at one eps joined (5, 25.0) and (5, 100.0) into one line; now a line each."""
    for proto in ("standard", "paper"):
        rbp.evaluate(model="deit", attack="pgd", eps=["4/255"], steps=2, limit=8, protocol=proto,
                     param={"early_stop": "false"}, out=str(tmp_path / proto), quiet=True)
    fig = plot_accuracy_vs_cost(rbp.load_results(tmp_path))
    (ax,) = [a for a in fig.axes if a.get_visible()]
    labels = sorted(c.get_label() for c in ax.containers)
    assert labels == ["deit · pgd (paper, digits)", "deit · pgd (standard, digits)"]
    assert all(len(c.lines[0].get_xdata()) == 1 for c in ax.containers)
