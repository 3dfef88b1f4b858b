"""Plots of ``attention.parquet``: each metric against depth (clean and each eps as separate curves,
models side by side) and the last layer's shift against eps. Matplotlib on an Agg canvas (``plots``),
pandas only; each function takes the summary of :func:`attention.summarize_attention`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import pandas as pd

from ...core.labels import eps_text
from .attention import METRICS, last_layer, run_suffix, summarize_attention
from .plots import FORMATS, _figure, save_figure


def _norms(df: pd.DataFrame) -> Dict[str, str]:
    if "norm" not in df.columns:
        return {}
    return {str(a): str(n) for a, n in df.drop_duplicates("attack")[["attack", "norm"]].itertuples(index=False)}


def plot_metric_depth(summary: pd.DataFrame, metric: str, norms: Optional[Dict[str, str]] = None) -> Optional[Any]:
    """``metric`` against layer, one panel per model, one curve (mean, 95% band) per condition."""
    s = summary[(summary["metric"] == metric) & (summary["n"] > 0)]
    if s.empty:
        return None
    models = sorted(s["model"].astype(str).unique())
    fig = _figure(3.6 * len(models) + 0.8, 3.2)
    axes = fig.subplots(1, len(models), sharey=True, squeeze=False)[0]
    norms = norms or {}
    for ax, model in zip(axes, models):
        g = s[s["model"] == model]
        suffix = run_suffix(g)
        for (attack, eps, run, sid), c in g.groupby(["attack", "eps", "run_id", "settings_id"], sort=True):
            c = c.sort_values("layer")  # one line per run and setting: PGD-2 and PGD-10 are not one curve
            label = "clean" if attack == "clean" else f"{attack} {eps_text(float(eps), norms.get(str(attack), 'linf'))}"
            label += suffix.get((model, attack, eps, run, sid), "")
            line, = ax.plot(c["layer"], c["value"], marker="o", ms=3, label=label)
            ax.fill_between(c["layer"], c["ci_low"], c["ci_high"], color=line.get_color(), alpha=0.15, lw=0)
        ax.set_title(model)
        ax.set_xlabel("layer (0 = embeddings)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(metric)
    axes[-1].legend(fontsize=7, loc="best")
    fig.suptitle(f"{metric}: {METRICS.get(metric, ('',))[0]}", fontsize=9)
    return fig


def plot_last_shift(summary: pd.DataFrame, norms: Optional[Dict[str, str]] = None) -> Optional[Any]:
    """The shift at each model's last layer against eps (95% intervals), one line per model and attack."""
    s = last_layer(summary[summary["n"] > 0], "shift")
    s = s[s["attack"] != "clean"]
    if s.empty:
        return None
    fig = _figure(4.8, 3.4)
    ax = fig.subplots()
    # one line per model, attack and setting-without-eps (a sweep's eps vary; other steps are another line)
    for (model, attack, run), g in s.groupby(["model", "attack", "run_id"], sort=True):
        g = g.sort_values("eps")
        x = g["eps"] * (255 if (norms or {}).get(str(attack), "linf") == "linf" else 1)
        many = s[(s["model"] == model) & (s["attack"] == attack)]["run_id"].nunique() > 1
        ax.errorbar(x, g["value"], yerr=[g["value"] - g["ci_low"], g["ci_high"] - g["value"]], marker="o", ms=4,
                    capsize=3, label=f"{model} ({attack}{', ' + str(run) if many else ''}, layer {int(g['layer'].iloc[0])})")
    ax.set_xlabel("eps (x/255 for Linf)")
    ax.set_ylabel("last-layer shift ||Δh|| / ||h||")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def attention_figures(df: pd.DataFrame) -> Dict[str, Any]:
    """Every attention figure by name: ``attention_<metric>`` per metric present, ``attention_last_shift``."""
    summary = summarize_attention(df)
    norms = _norms(df)
    out: Dict[str, Any] = {}
    for metric in [m for m in METRICS if m in set(summary["metric"])]:
        fig = plot_metric_depth(summary, metric, norms)
        if fig is not None:
            out[f"attention_{metric}"] = fig
    fig = plot_last_shift(summary, norms)
    if fig is not None:
        out["attention_last_shift"] = fig
    return out


def write_attention_plots(df: Optional[pd.DataFrame], out_dir: Union[str, Path],
                          formats: Sequence[str] = FORMATS) -> Tuple[List[Path], List[str]]:
    """Save every attention figure; (files, notes)."""
    if df is None or df.empty:
        return [], ["attention: skipped (no attention.parquet: evaluate with --analyze attention)"]
    paths: List[Path] = []
    for name, fig in attention_figures(df).items():
        paths += save_figure(fig, out_dir, name, formats)
    return paths, []
