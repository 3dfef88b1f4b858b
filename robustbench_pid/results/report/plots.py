"""Plots (matplotlib): accuracy against eps, accuracy against attack cost, the convergence ladder's curve,
per-corruption CE bars, rank-collapse curves.

Each plot is a function taking results (a path, tidy DataFrame or records) and returning a
``matplotlib.figure.Figure`` (or ``None`` when the results hold nothing for it), so a notebook can
call it; ``write_plots`` saves all of them as PNG and SVG. Figures are built with the
object-oriented API on an Agg canvas, never through pyplot's global state, so this works headless
(CI, servers) and does not change a notebook's backend.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ...errors import UserError
from ..conditions import differing_settings, flat_settings
from ..inputs import ACCURACY_METRICS, OOD_DATASETS, as_inputs, norm_of
from ..files.outputs import output_dir
from ..files.run_files import atomic_write_bytes

FORMATS = ("png", "svg")


def _figure(width: float, height: float, dpi: int = 100):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _panel_grid(n: int):
    """A figure of ``n`` panels, three to a row: (figure, axes, columns)."""
    ncol = min(3, n)
    fig = _figure(4.2 * ncol, 3.3 * int(np.ceil(n / ncol)))
    return fig, fig.subplots(int(np.ceil(n / ncol)), ncol, squeeze=False).ravel(), ncol


def _finish_panels(fig: Any, axes: Any, n: int, ncol: int, title: str, note: str) -> None:
    """Hide the unused panels; the title on two lines when one 4.2-in panel would clip it at both ends."""
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle(title + ("\n" if ncol == 1 else " ") + note, fontsize=10)


def _accuracy_axes(ax: Any, xlabel: str, ylabel: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot_eps_curves(data: Any, metric: str = "top1", attacks: Optional[Sequence[str]] = None,
                    dataset: Optional[str] = None, protocol: Optional[str] = None,
                    models: Optional[Sequence[str]] = None, ce_baseline: Optional[str] = None):
    """Accuracy against eps, one panel per attack (and protocol), one line per model, 95% band.

    Clean accuracy is drawn at eps 0 of every panel (an attack at eps 0 is the clean input).
    Attacks run at a single eps get no panel, unless no attack was run at several.
    """
    if metric not in ACCURACY_METRICS:
        raise UserError(f"metric must be one of {', '.join(ACCURACY_METRICS)}, got {metric!r}")
    df = as_inputs(data, ce_baseline=ce_baseline).results
    df = df[(df["metric"] == metric) & (df["benchmark"] == "adversarial")] if "adversarial" in set(df["benchmark"]) \
        else df[df["metric"] == metric]
    df = df[~df["dataset"].isin(OOD_DATASETS)]
    if dataset is not None:
        df = df[df["dataset"] == dataset]
    if protocol is not None:
        df = df[df["protocol"] == protocol]
    if models:
        df = df[df["label"].isin(models)]
    att = df[df["attack"] != "clean"]
    if attacks:
        att = att[att["attack"].isin(attacks)]
    if att.empty:
        return None
    panels = sorted({(a, d, p) for a, d, p in zip(att["attack"], att["dataset"], att["protocol"])})
    multi = [k for k in panels if att[(att["attack"] == k[0]) & (att["dataset"] == k[1]) &
                                      (att["protocol"] == k[2])]["eps_key"].nunique() > 1]
    dropped = [k for k in panels if k not in multi] if multi else []  # one eps: a point, not a curve
    panels = multi or panels
    many_ds = len({k[1] for k in panels}) > 1
    many_proto = len({k[2] for k in panels}) > 1
    order = list(models) if models else sorted(df["label"].unique())
    colors = {m: f"C{i % 10}" for i, m in enumerate(order)}
    fig, axes, ncol = _panel_grid(len(panels))
    for ax, (attack, ds, proto) in zip(axes, panels):
        sub = att[(att["attack"] == attack) & (att["dataset"] == ds) & (att["protocol"] == proto)]
        clean = df[(df["attack"] == "clean") & (df["dataset"] == ds) & (df["protocol"] == proto)]
        linf = norm_of(sub, attack) == "linf"
        scale = 255.0 if linf else 1.0
        tags = setting_tags(sub)  # one line per model and setting: PGD-10 and PGD-20 are never one curve
        for m in order:
            for k, (sid, tag) in enumerate(tags.items()):
                s = sub[(sub["label"] == m) & (sub["settings_id"] == sid)].sort_values("eps_key")
                if s.empty:
                    continue
                c = clean[clean["label"] == m]
                if "run_id" in c.columns and (c["run_id"].isin(s["run_id"])).any():
                    c = c[c["run_id"].isin(s["run_id"])]  # the clean point of the attacked samples' own run
                x = list(s["eps"] * scale)
                y, lo, hi = list(s["value"]), list(s["ci_low"]), list(s["ci_high"])
                if len(c):
                    x, y = [0.0] + x, [float(c["value"].iloc[0])] + y
                    lo, hi = [float(c["ci_low"].iloc[0])] + lo, [float(c["ci_high"].iloc[0])] + hi
                ax.plot(x, y, marker="o", ms=3.5, color=colors[m], linestyle=LINESTYLES[k % len(LINESTYLES)],
                        label=f"{m} · {tag}" if tag else m)
                lo_a, hi_a = np.asarray(lo, float), np.asarray(hi, float)
                if np.isfinite(lo_a).all() and np.isfinite(hi_a).all():
                    ax.fill_between(x, lo_a, hi_a, color=colors[m], alpha=0.15, linewidth=0)
        title = str(sub["attack_label"].iloc[0])
        extra = [ds] if many_ds else []
        extra += [proto] if many_proto else []
        ax.set_title(title + (f" ({', '.join(extra)})" if extra else ""))
        _accuracy_axes(ax, "eps (x/255)" if linf else "eps", f"{'top-1' if metric == 'top1' else 'top-5'} accuracy (%)")
    _finish_panels(fig, axes, len(panels), ncol, "Accuracy against perturbation size", "(shaded: 95% Wilson interval)")
    if dropped:  # said on the figure and by figures(): an attack run at one eps is in the tables, not here
        names = ", ".join(sorted({str(att.loc[att["attack"] == a, "attack_label"].iloc[0]) +
                                  (f" ({p})" if many_proto else "") for a, _, p in dropped}))
        fig.dropped = f"not drawn, run at one eps only (see the table): {names}"
        fig.supxlabel(fig.dropped, fontsize=8)
    return fig


LINESTYLES = ("-", "--", ":", "-.")


def setting_tags(rows: Any) -> Dict[str, str]:
    """settings_id -> what tells its curve apart from the others of the panel (``steps 10``), ''
    when the panel has one setting; the settings that differ, as the tables label their rows."""
    first = rows.drop_duplicates("settings_id")
    ids = list(first["settings_id"])
    if len(ids) <= 1:
        return {i: "" for i in ids}
    raw = dict(zip(ids, first["settings"].astype(str) if "settings" in first.columns else [""] * len(ids)))
    differing = differing_settings(raw.values())
    out = {}
    for i, setting in zip(ids, first["setting"].astype(str)):
        flat = flat_settings(raw[i]) or {}
        out[i] = ", ".join(f"{k} {flat.get(k, '(unset)')}" for k in differing) or setting or i
    return out


def plot_corruption_errors(data: Any, models: Optional[Sequence[str]] = None, dataset: Optional[str] = None,
                           ce_baseline: Optional[str] = None):
    """Per-corruption CE bars (``ce_<corruption>`` rows), one bar per model; without a CE baseline
    (non-ImageNet data and no baseline model) the per-corruption top-1 error (``err_``) instead;
    ``None`` without corruption rows."""
    df = as_inputs(data, ce_baseline=ce_baseline).results
    metric = df["metric"].astype(str)
    prefix = "ce_" if metric.str.startswith("ce_").any() else "err_"
    df = df[metric.str.startswith(prefix)]
    if dataset is not None:
        df = df[df["dataset"] == dataset]
    if models:
        df = df[df["label"].isin(models)]
    if df.empty:
        return None
    df = df.assign(corruption=df["metric"].str[len(prefix):])
    groups = sorted({(d, p) for d, p in zip(df["dataset"], df["protocol"])})
    order = list(models) if models else sorted(df["label"].unique())
    fig = _figure(max(6.0, 0.55 * df["corruption"].nunique() * max(1, len(order)) / 1.5), 3.4 * len(groups))
    axes = fig.subplots(len(groups), 1, squeeze=False).ravel()
    for ax, (ds, proto) in zip(axes, groups):
        sub = df[(df["dataset"] == ds) & (df["protocol"] == proto)]
        corr = list(dict.fromkeys(sub["corruption"]))
        width = 0.8 / max(1, len(order))
        x = np.arange(len(corr))
        for i, m in enumerate(order):
            s = sub[sub["label"] == m].set_index("corruption").reindex(corr)
            ax.bar(x + (i - (len(order) - 1) / 2) * width, s["value"].to_numpy(float), width, label=m,
                   color=f"C{i % 10}")
        ax.set_xticks(x)
        ax.set_xticklabels(corr, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("CE (%)" if prefix == "ce_" else "top-1 error (%), mean over severities")
        ax.set_title(f"{'Corruption error (CE)' if prefix == 'ce_' else 'Top-1 error'} per corruption ({ds}, {proto})")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def plot_rank_collapse(data: Any, path: Union[str, Path] = "rank_collapse.png") -> Optional[Path]:
    """Rank-collapse curves (PNG) when the results hold ``token_cosine`` rows; ``None`` otherwise."""
    out, _ = write_rank_collapse(data, path)
    return out


def write_rank_collapse(data: Any, path: Union[str, Path]) -> Tuple[Optional[Path], str]:
    """(the PNG written, '') or (None, why not)."""
    res = as_inputs(data).rows
    rows = res[res["metric"].astype(str) == "token_cosine"]
    if rows.empty:
        return None, "no token_cosine rows in these results (evaluate --benchmark rank-collapse)"
    return draw_rank_collapse(rows, path), ""


def _series_label(keys: tuple, cols: Sequence[str]) -> str:
    parts = [str(v) for c, v in zip(cols, keys) if c != "checkpoint_sha256" and str(v) not in ("", "nan", "None")]
    sha = dict(zip(cols, keys)).get("checkpoint_sha256")
    if sha and str(sha) not in ("nan", "None"):
        parts.append(f"[{str(sha)[:8]}]")
    return " ".join(parts)


def draw_rank_collapse(df: Any, path: Union[str, Path], title: Optional[str] = None) -> Path:
    """Token cosine similarity against depth, one line (with its 95% band) per model, one PNG."""
    from matplotlib.ticker import MaxNLocator

    if "metric" in df.columns:
        df = df[df["metric"] == "token_cosine"]
    if df.empty or "layer" not in df.columns:
        raise UserError("no token_cosine rows to plot (run `evaluate --benchmark rank-collapse` first)")
    cols = [c for c in ("model", "dataset", "checkpoint_sha256", "run_id") if c in df.columns]
    groups = list(df.groupby(cols, sort=False, dropna=False)) if cols else [((), df)]  # a line per run
    multi_ds = "dataset" in df.columns and df["dataset"].nunique() > 1
    multi_run = "run_id" in df.columns and (df.groupby([c for c in cols if c != "run_id"] or ["run_id"])["run_id"]
                                            .nunique() > 1).any()
    label_cols = [c for c in cols if (c != "dataset" or multi_ds) and (c != "run_id" or multi_run)]
    fig = _figure(6.4, 4.2, dpi=120)
    ax = fig.add_subplot()
    for keys, g in groups:
        keys = keys if isinstance(keys, tuple) else (keys,)
        g = g.sort_values("layer")
        lab = _series_label(tuple(v for c, v in zip(cols, keys) if c in label_cols), label_cols) or "model"
        ax.plot(g["layer"], g["value"], marker="o", ms=3.5, label=lab)
        if {"ci_low", "ci_high"} <= set(g.columns) and g["ci_low"].notna().all():
            ax.fill_between(g["layer"], g["ci_low"], g["ci_high"], alpha=0.2)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("layer (0 = patch + position embeddings)")
    ax.set_ylabel("average pairwise token cosine similarity")
    ax.set_title(title or "Token similarity against depth (rank collapse)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, figure_bytes(fig, "png"), durable=False)  # a link there is replaced, not followed
    return path


def plot_accuracy_vs_cost(data: Any, ce_baseline: Optional[str] = None):
    """Robust top-1 against the attack's cost (forward + backward passes per attacked sample, the
    ``passes_*`` rows of the evidence telemetry) for the iterative attacks: one panel per eps, one line per
    model and attack through its settings (PGD-10, PGD-20, ...), so "more steps, lower accuracy" shows
    whether the reported number has converged. One-pass attacks (FGSM, noise) are left out."""
    df = as_inputs(data, ce_baseline=ce_baseline).results
    df = df[(df["benchmark"] == "adversarial") & (df["attack"] != "clean")]
    keys = ["label", "attack", "eps_key", "settings_id", "protocol", "dataset"]
    cost = df[df["metric"].isin(["passes_forward", "passes_backward"])].groupby(keys)["value"].sum()
    acc = df[df["metric"] == "top1"].set_index(keys)
    both = acc.join(cost.rename("passes"), how="inner").reset_index()
    both = both[both["passes"] > 3]  # iterative: more than one forward + one backward + the verdict
    if both.empty:
        return None
    # a panel per eps, protocol and dataset: the paper protocol's eps is in normalised units, another ball than the
    # standard protocol's pixel eps of the same number, so they never share a panel
    panels = sorted({(e, p, d) for e, p, d in zip(both["eps_key"], both["protocol"], both["dataset"])})
    many_ds = both["dataset"].nunique() > 1
    labels = sorted(both["label"].unique())
    colors = {m: f"C{i % 10}" for i, m in enumerate(labels)}  # one colour per model in every panel
    marks = {a: "osD^v<>"[i % 7] for i, a in enumerate(sorted(both["attack"].unique()))}  # and a marker per attack
    styles = {m: LINESTYLES[(i // 10) % len(LINESTYLES)] for i, m in enumerate(labels)}  # past 10 models
    fig, axes, ncol = _panel_grid(len(panels))
    handles: Dict[str, Any] = {}
    for ax, (eps_key, proto, ds) in zip(axes, panels):
        sub = both[(both["eps_key"] == eps_key) & (both["protocol"] == proto) & (both["dataset"] == ds)]
        for (label, attack), s in sub.groupby(["label", "attack"], sort=True):
            s = s.sort_values("passes")
            # clipped: a tidy CSV written before wilson_interval's ends were exact can hold a bound 1e-16 past its point
            err = np.clip([s["value"] - s["ci_low"], s["ci_high"] - s["value"]], 0.0, None)
            h = ax.errorbar(s["passes"], s["value"], yerr=err, marker=marks[attack], ms=3.5, capsize=2,
                            color=colors[label], linestyle=styles[label], label=f"{label} · {attack}")
            handles.setdefault(f"{label} · {attack}", h)
        first = sub.iloc[0]
        linf = norm_of(sub, str(first["attack"])) == "linf"
        eps = f"eps {first['eps'] * 255:g}/255" if linf else f"eps {first['eps']:g}"
        units = " (normalised units)" if proto == "paper" else ""
        ax.set_title(f"{eps} · {proto} protocol{units}" + (f" · {ds}" if many_ds else ""), fontsize=9)
        ax.set_xlabel("passes per attacked sample (forward + backward)")
        ax.set_ylabel("robust top-1 accuracy (%)")
        ax.set_ylim(-2, 102)
        ax.grid(alpha=0.3)
    # one legend for the figure, outside the panels: it never covers a point
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", fontsize=7,
               ncol=min(4, max(1, len(handles))))
    _finish_panels(fig, axes, len(panels), ncol, "Robust accuracy against attack cost", "(bars: 95% Wilson interval)")
    return fig


def plot_convergence(data: Any, ce_baseline: Optional[str] = None) -> Any:
    """``--converge``'s curve: robust accuracy after each rung against the cumulative passes per sample,
    one panel per eps, one line per model and ladder (its status in the legend, so an upper bound
    never reads as a converged number). None when the results hold no ladder rows."""
    df = as_inputs(data, ce_baseline=ce_baseline).results
    if "benchmark" not in df.columns:
        return None
    rows = df[(df["benchmark"] == "converge") & (df["metric"] == "rung_top1")].copy()
    if rows.empty:
        return None
    rows["passes"] = rows["passes_forward_cum"].astype(float) + rows["passes_backward_cum"].astype(float)
    panels = sorted(rows["eps"].unique())
    fig, axes, ncol = _panel_grid(len(panels))
    for ax, eps in zip(axes, panels):
        sub = rows[rows["eps"] == eps]
        for i, ((label, sid), s) in enumerate(sub.groupby(["label", "settings_id"], sort=True)):
            s = s.sort_values("rung_index")
            ax.errorbar(s["passes"], s["value"], yerr=[s["value"] - s["ci_low"], s["ci_high"] - s["value"]],
                        marker="o", ms=3.5, capsize=2, color=f"C{i % 10}",
                        label=f"{label} ({s['status'].iloc[0] if 'status' in s.columns else ''})")
            for _, r in s.iterrows():
                ax.annotate(str(r["rung"]), (r["passes"], r["value"]), fontsize=6, xytext=(2, 3),
                            textcoords="offset points")
        ax.set_xscale("symlog", linthresh=10)
        ax.set_title(f"eps {float(eps) * 255:g}/255")
        _accuracy_axes(ax, "cumulative passes per sample (forward + backward)", "robust top-1 accuracy (%)")
    _finish_panels(fig, axes, len(panels), ncol, "Convergence ladder",
                   "(95% Wilson bars; later rungs attack only samples still robust)")
    return fig


PLOTS: Dict[str, Callable[[Any], Any]] = {
    "eps_curves_top1": lambda d: plot_eps_curves(d, "top1"),
    "eps_curves_top5": lambda d: plot_eps_curves(d, "top5"),
    "corruption_errors": plot_corruption_errors,
    "accuracy_vs_cost": plot_accuracy_vs_cost,
    "convergence": plot_convergence,
}
SKIP_REASONS = {"eps_curves_top1": "no attack rows", "eps_curves_top5": "no attack rows",
                "accuracy_vs_cost": "no iterative attack with pass counts (runs before the evidence telemetry)",
                "corruption_errors": "no per-corruption rows (evaluate --benchmark corruptions)",
                "convergence": "no convergence ladder rows (evaluate --converge)"}


def figures(data: Any, ce_baseline: Optional[str] = None) -> Tuple[Dict[str, Any], List[str]]:
    """Every matplotlib figure the results allow, by name, and a note for each one skipped."""
    inp = as_inputs(data, ce_baseline=ce_baseline)
    out: Dict[str, Any] = {}
    notes: List[str] = []
    for name, fn in PLOTS.items():
        fig = fn(inp)
        if fig is None:
            notes.append(f"{name}: skipped ({SKIP_REASONS[name]})")
        else:
            out[name] = fig
            if getattr(fig, "dropped", None):
                notes.append(f"{name}: {fig.dropped}")
    return out, notes


def check_formats(formats: Sequence[str]) -> List[str]:
    """The figure formats asked for, each one of :data:`FORMATS` (a format is also the files' suffix)."""
    fmts = [formats] if isinstance(formats, str) else list(formats)
    bad = [f for f in fmts if f not in FORMATS]
    if bad or not fmts:
        raise UserError(f"plot format {bad[0] if bad else '(none)'!r}: choose from {', '.join(FORMATS)}")
    return fmts


def save_figure(fig: Any, out_dir: Union[str, Path], name: str, formats: Sequence[str] = FORMATS) -> List[Path]:
    formats = check_formats(formats)
    d = output_dir(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        p = d / f"{name}.{fmt}"
        # through a temp file and a rename: a symlink standing at p is replaced, never written through
        atomic_write_bytes(p, figure_bytes(fig, fmt), durable=False)
        paths.append(p)
    return paths


def figure_bytes(fig: Any, fmt: str = "svg") -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, **({"metadata": {"Date": None}} if fmt == "svg" else {}))
    return buf.getvalue()


def write_plots(data: Any, out_dir: Union[str, Path], formats: Sequence[str] = FORMATS,
                ce_baseline: Optional[str] = None) -> Tuple[List[Path], List[str]]:
    """Writes every available plot as PNG and SVG; returns the files and the skip notes."""
    formats = check_formats(formats)
    output_dir(out_dir)  # a file where the folder goes: one error before any work (outputs.py)
    inp = as_inputs(data, ce_baseline=ce_baseline)
    figs, notes = figures(inp)
    paths: List[Path] = []
    for name, fig in figs.items():
        paths += save_figure(fig, out_dir, name, formats)
    rc, why = write_rank_collapse(inp, Path(out_dir) / "rank_collapse.png")
    if rc is None:
        notes.append(f"rank_collapse: skipped ({why})")
    else:
        paths.append(rc)
        if "svg" in formats:
            notes.append("rank_collapse: PNG only (drawn by robustbench_pid.probes.rank_collapse)")
    return paths, notes
