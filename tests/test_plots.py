"""Plots: written as PNG and SVG, non-empty, with the data they claim to show."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from robustbench_pid.cli import main
from robustbench_pid.results.stats.metrics import wilson_interval
from robustbench_pid.results.report.plots import plot_corruption_errors, plot_eps_curves, plot_rank_collapse, write_plots


def _acc(model, attack, eps, k, n=100, metric="top1"):
    lo, hi = wilson_interval(k, n)
    return dict(run_id=f"r_{model}", model=model, checkpoint_sha256=None, dataset="digits", protocol="standard",
                benchmark="adversarial", attack=attack, eps=eps, metric=metric, value=100 * k / n, n=n,
                ci_low=100 * lo, ci_high=100 * hi, attack_label=attack.upper(),  # as summarize stamps them
                norm="" if attack == "clean" else "linf")


@pytest.fixture()
def tidy():
    rows = []
    for model, base in (("deit", 0), ("pid_deit", 8)):
        rows.append(_acc(model, "clean", 0.0, 98))
        for i, k in zip((1, 2, 4), (80, 60, 30)):
            rows.append(_acc(model, "pgd", i / 255, k + base))
            rows.append(_acc(model, "fgsm", i / 255, k + 5 + base))
        rows.append(_acc(model, "noise", 8 / 255, 97))  # one eps only: no panel of its own
    return pd.DataFrame(rows)


def test_eps_curves_show_clean_then_each_eps(tidy):
    fig = plot_eps_curves(tidy)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["FGSM", "PGD"]
    pgd = axes[1]
    lines = {ln.get_label(): ln for ln in pgd.get_lines()}
    assert set(lines) == {"deit", "pid_deit"}
    assert list(lines["deit"].get_xdata()) == pytest.approx([0.0, 1.0, 2.0, 4.0])  # eps in /255 units, clean at 0
    assert list(lines["pid_deit"].get_ydata()) == [98.0, 88.0, 68.0, 38.0]
    assert pgd.get_xlabel() == "eps (x/255)"
    assert plot_eps_curves(tidy, attacks=["nope"]) is None


def test_an_attack_run_at_one_eps_is_named_not_dropped_silently(tidy, tmp_path):
    fig = plot_eps_curves(tidy)
    assert fig.dropped == "not drawn, run at one eps only (see the table): NOISE"
    assert fig._supxlabel.get_text() == fig.dropped  # said on the figure itself
    _, notes = write_plots(tidy, tmp_path, formats=("png",))
    assert "eps_curves_top1: not drawn, run at one eps only (see the table): NOISE" in notes
    only_one = tidy[tidy["attack"].isin(["clean", "noise"])]  # nothing at several eps: the points are the figure
    assert not getattr(plot_eps_curves(only_one), "dropped", None)


def test_write_plots_png_and_svg_non_empty(tidy, tmp_path):
    paths, notes = write_plots(tidy, tmp_path)
    names = sorted(p.name for p in paths)
    assert names == ["eps_curves_top1.png", "eps_curves_top1.svg"]  # no top5 rows in these results
    for p in paths:
        data = p.read_bytes()
        assert len(data) > 5000
        if p.suffix == ".png":
            assert data[:8] == b"\x89PNG\r\n\x1a\n"
        else:
            assert b"<svg" in data[:2000]
    assert any(n.startswith("corruption_errors: skipped") for n in notes)
    assert any(n.startswith("rank_collapse: skipped") for n in notes)


def test_corruption_bars_prefer_ce_then_error(tidy):
    rows = []
    for model, off in (("deit", 0.0), ("pid_deit", -5.0)):
        for c, v in (("gaussian_noise", 60.0), ("fog", 40.0), ("contrast", 30.0)):
            rows.append(dict(run_id=f"c_{model}", model=model, checkpoint_sha256=None, dataset="digits",
                             protocol="standard", benchmark="corruptions", attack=c, eps=0.0, metric=f"err_{c}",
                             value=v + off, n=100, ci_low=np.nan, ci_high=np.nan))
    df = pd.DataFrame(rows)
    fig = plot_corruption_errors(df)
    ax = fig.axes[0]
    assert ax.get_ylabel().startswith("top-1 error")
    heights = sorted(round(b.get_height(), 6) for b in ax.patches)
    assert heights == [25.0, 30.0, 35.0, 40.0, 55.0, 60.0]
    ce = df.assign(metric=df["metric"].str.replace("err_", "ce_"), value=df["value"] * 1.5)
    fig2 = plot_corruption_errors(pd.concat([df, ce]))
    assert fig2.axes[0].get_ylabel() == "CE (%)"
    assert max(b.get_height() for b in fig2.axes[0].patches) == pytest.approx(90.0)
    assert plot_corruption_errors(tidy) is None


def test_rank_collapse_curves(tmp_path):
    rows = [dict(run_id=f"rc_{m}", model=m, checkpoint_sha256=None, dataset="digits", protocol="standard",
                 benchmark="rank-collapse", attack="clean", eps=0.0, metric="token_cosine", layer=layer,
                 condition=f"layer={layer}", value=v, n=10, ci_low=v - 0.01, ci_high=v + 0.01)
            for m, slope in (("deit", 0.08), ("pid_deit", 0.04)) for layer, v in
            ((layer, 0.2 + slope * layer) for layer in range(5))]
    out = plot_rank_collapse(pd.DataFrame(rows), tmp_path / "rc.png")
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_plot_cli(tidy, tmp_path, capsys):
    csv = tmp_path / "results.csv"
    tidy.to_csv(csv, index=False)
    assert main(["plot", str(csv), "--out", str(tmp_path / "plots"), "--format", "png"]) == 0
    out = capsys.readouterr().out
    assert "eps_curves_top1.png" in out and (tmp_path / "plots" / "eps_curves_top1.png").stat().st_size > 5000
    assert not (tmp_path / "plots" / "eps_curves_top1.svg").exists()


@pytest.mark.parametrize("formats", [["../x"], ["pdf"], []])
def test_a_plot_format_outside_png_svg_is_one_error_before_any_file(tidy, tmp_path, formats):
    """A format is the files' suffix: write_plots(formats=["../x"]) was a matplotlib traceback mid-write."""
    from robustbench_pid.errors import UserError

    with pytest.raises(UserError, match="plot format .*: choose from png, svg"):
        write_plots(tidy, tmp_path / "p", formats=formats)
    assert not (tmp_path / "p").exists()
