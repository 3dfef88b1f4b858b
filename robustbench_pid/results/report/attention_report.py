"""The report section "Inside the model under attack" (``attention.parquet``), and the same as Markdown.

Tables: per model and condition, the last layer's shift, token similarity and effective rank with 95%
intervals; per pair of models, the paired comparison of the shift and the token similarity at every
layer on the same samples (Wilcoxon signed-rank p, paired-bootstrap interval). A plain verdict on the
PIDformer claims is stated when the runs hold a PID model (it has ``pid_*`` rows) and a model without
PID: "PID damps the perturbation" holds at a condition when the PID model's last-layer shift (and, through
depth, its gain: last-layer shift / embedding shift) is lower and the paired difference is significant;
"PID keeps token diversity" when its last-layer token similarity under attack is lower (or its effective
rank higher), significantly; "contradicts" when significantly the other way. Pandas only.
"""
from __future__ import annotations

import html
from itertools import combinations
from typing import Any, Dict, List, Optional, Tuple

import pandas as pd

from ...core.labels import eps_text
from .attention import (METRICS, attention_of_runs, last_layer, paired_attention, run_suffix, summarize_attention,
                        with_shift_gain)
from .attention_plots import _norms, attention_figures
from .plots import figure_bytes
from ..tables.render import Table, fmt_p, render_html, render_markdown

TITLE = "Inside the model under attack"
# metric -> (the claim, +1 if the claim means a higher value for PID, -1 a lower one)
CLAIMS = {"shift": ("PID damps the perturbation", -1),
          "shift_gain": ("PID damps the perturbation through depth", -1),
          "token_similarity": ("PID keeps token diversity (token similarity)", -1),
          "effective_rank": ("PID keeps token diversity (effective rank)", +1)}


def _v(v: float, lo: float, hi: float) -> str:
    return "—" if pd.isna(v) else f"{v:.4g} [{lo:.4g}, {hi:.4g}]"


def _cond(attack: str, eps: float, norms: Dict[str, str]) -> str:
    return "clean" if attack == "clean" else f"{attack} {eps_text(float(eps), norms.get(str(attack), 'linf'))}"


def last_layer_table(df: pd.DataFrame) -> Table:
    """Per model and condition: the last layer's shift, token similarity and effective rank."""
    summary, norms = summarize_attention(with_shift_gain(df)), _norms(df)
    parts = {m: last_layer(summary, m) for m in ("shift", "shift_gain", "token_similarity", "effective_rank")}
    base = parts["shift"][["model", "attack", "eps", "run_id", "settings_id", "layer", "n"]]
    suffix = run_suffix(summary)
    rows = []
    for r in base.itertuples(index=False):
        key = (r.model, r.attack, r.eps, r.run_id, r.settings_id)
        row = {"model": r.model, "condition": _cond(r.attack, r.eps, norms) + suffix.get(key, ""),
               "layer": int(r.layer), "n": int(r.n)}
        for m, p in parts.items():
            hit = p[(p["model"] == r.model) & (p["attack"] == r.attack) & (p["eps"] == r.eps)
                    & (p["run_id"] == r.run_id) & (p["settings_id"] == r.settings_id)]
            row[m] = _v(*hit[["value", "ci_low", "ci_high"]].iloc[0]) if len(hit) else "—"
        rows.append(row)
    return Table(pd.DataFrame(rows), "Last layer: representation shift (and its gain over the embeddings), token similarity, effective rank",
                 ["mean [95% normal interval]; clean: all samples; an attack: the samples it moved",
                  "shift = ||h(x_adv) - h(x)|| / ||h(x)|| (0 on clean by definition); shift_gain = last-layer shift / "
                  "embedding (layer 0) shift per sample (> 1: the blocks amplify the perturbation)"])


def paired_tables(df: pd.DataFrame, n_boot: int = 1000) -> List[Tuple[Table, pd.DataFrame]]:
    """For every pair of models and each claim metric: the per-layer paired comparison (attacks only)."""
    norms, out = _norms(df), []
    models = sorted(df["model"].astype(str).unique())
    df = with_shift_gain(df)
    for a, b in combinations(models, 2):
        for metric in CLAIMS:
            c = paired_attention(df, a, b, metric, n_boot=n_boot)
            c = c[c["attack"] != "clean"] if len(c) else c
            if c.empty:
                continue
            frame = pd.DataFrame({
                "condition": [_cond(r.attack, r.eps, norms) for r in c.itertuples()], "layer": c["layer"],
                "n": c["n"], a: c["mean_a"].map("{:.4g}".format), b: c["mean_b"].map("{:.4g}".format),
                "Δ (B−A)": [f"{d:+.4g} [{lo:+.4g}, {hi:+.4g}]" for d, lo, hi in zip(c["delta"], c["ci_low"], c["ci_high"])],
                "p (Wilcoxon)": c["p_wilcoxon"].map(fmt_p)})
            out.append((Table(frame.reset_index(drop=True), f"{metric}: {b} (B) vs {a} (A), same samples, per layer",
                              [f"{metric}: {METRICS[metric][0]}", "Δ: mean paired difference with a paired-bootstrap "
                               "95% interval; p: Wilcoxon signed-rank, * p < 0.05; samples the attack moved in both"]),
                        c))
    return out


def verdict(df: pd.DataFrame, n_boot: int = 1000) -> List[str]:
    """Plain sentences on the PIDformer claims, one per (PID model, other model, condition, claim)."""
    pid = set(df.loc[df["metric"].str.startswith("pid_"), "model"].astype(str))
    other = sorted(set(df["model"].astype(str)) - pid)
    norms, lines = _norms(df), []
    df = with_shift_gain(df)
    for p in sorted(pid):
        for o in other:
            for metric, (claim, sign) in CLAIMS.items():
                c = paired_attention(df, o, p, metric, n_boot=n_boot)
                c = c[c["attack"] != "clean"]
                for (attack, eps), g in c.groupby(["attack", "eps"], sort=True):
                    r = g[g["layer"] == g["layer"].max()].iloc[0]
                    holds = sign * r["delta"] > 0 and r["significant"]
                    against = sign * r["delta"] < 0 and r["significant"]
                    word = "agrees" if holds else ("contradicts" if against else "is not supported (no significant difference)")
                    lines.append(f"{_cond(attack, eps, norms)}, last layer {int(r['layer'])}: {metric} {p} {r['mean_b']:.4g} vs "
                                 f"{o} {r['mean_a']:.4g} (Δ {r['delta']:+.4g} [{r['ci_low']:+.4g}, {r['ci_high']:+.4g}], "
                                 f"Wilcoxon p {r['p_wilcoxon']:.3g}, n {int(r['n'])}): the claim \"{claim}\" {word}.")
    return lines


def attention_markdown(df: pd.DataFrame, n_boot: int = 1000) -> str:
    """The section as Markdown (tables and verdict), for scripts and docs."""
    tables = [last_layer_table(df)] + [t for t, _ in paired_tables(df, n_boot)]
    lines = verdict(df, n_boot)
    text = render_markdown(tables)
    if lines:
        text += "\n\n**Verdict on the digits models vs the PIDformer claims**\n\n" + "\n".join(f"- {s}" for s in lines)
    return text + "\n"


def attention_section(inp: Any, n_boot: int = 1000) -> str:
    """The HTML section, or "" when no run of the report has ``attention.parquet``."""
    df: Optional[pd.DataFrame] = attention_of_runs(getattr(inp, "runs", []) or [])
    if df is None or df.empty:
        return ""
    parts = [f"<h2>{TITLE}</h2><p class='muted'>evaluate --analyze attention: one hooked forward pass per "
             f"sample and condition on the attack's final points; metrics in docs/benchmarks.md</p>",
             render_html([last_layer_table(df)])]
    lines = verdict(df, n_boot)
    if lines:
        parts.append("<h3>Verdict (PIDformer claims)</h3><ul>" +
                     "".join(f"<li>{html.escape(s)}</li>" for s in lines) + "</ul>")
    for t, _ in paired_tables(df, n_boot):
        parts.append(f"<details><summary>{html.escape(t.title)}</summary>{render_html([t])}</details>")
    for name, fig in attention_figures(df).items():
        svg = figure_bytes(fig, "svg").decode()
        svg = svg[svg.find("<svg"):]
        parts.append(f"<figure id='plot-{html.escape(name)}'>{svg}<figcaption>{html.escape(name)}</figcaption></figure>")
    return "".join(parts)
