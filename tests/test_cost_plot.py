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
    # the paper protocol's 4/255 is in normalised units, another ball: a panel each, never one "eps 4/255" panel
    axes = {a.get_title(): a for a in fig.axes if a.get_visible()}
    assert sorted(axes) == ["eps 4/255 · paper protocol (normalised units)", "eps 4/255 · standard protocol"]
    for ax in axes.values():
        assert [c.get_label() for c in ax.containers] == ["deit · pgd"]
        assert len(ax.containers[0].lines[0].get_xdata()) == 1 and ax.get_legend() is None
    colours = {ax.containers[0].lines[0].get_color() for ax in axes.values()}
    assert len(colours) == 1  # one model, one colour in every panel
    assert len(fig.legends) == 1  # one legend, outside the panels: it covers no point


def test_models_keep_one_colour_and_attacks_a_marker() -> None:
    """Eleven models and two attacks in one panel: colours repeat only past ten models (then the line style
    differs), each attack has its own marker."""
    rows = []
    for i in range(11):
        for attack, f in (("pgd", 21.0), ("apgd", 41.0)):
            for metric, v in (("top1", 50.0), ("passes_forward", f), ("passes_backward", f - 1)):
                rows.append(dict(run_id=f"r{i}{attack}", model=f"m{i:02d}", dataset="digits", protocol="standard",
                                 benchmark="adversarial", attack=attack, eps=4 / 255, metric=metric, value=v,
                                 ci_low=v - 5, ci_high=v + 5, n=16, norm="linf"))
    fig = plot_accuracy_vs_cost(pd.DataFrame(rows))
    (ax,) = [a for a in fig.axes if a.get_visible()]
    style = {c.get_label(): (c.lines[0].get_color(), c.lines[0].get_linestyle(), c.lines[0].get_marker())
             for c in ax.containers}
    assert len(style) == 22 and len(set(style.values())) == 22  # every line told apart
    assert style["m00 · pgd"][0] == style["m00 · apgd"][0] and style["m00 · pgd"][2] != style["m00 · apgd"][2]
