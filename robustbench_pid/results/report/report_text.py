"""Plain-text rendering of summaries for the terminal."""
from __future__ import annotations

import pandas as pd

from ...core.labels import eps_text
from .evidence_rows import EVIDENCE_METRICS
from ..summaries.converge import CONVERGE_METRICS


def format_summary(summary: pd.DataFrame) -> str:
    """Accuracy as one line per condition (top-1 / top-5 columns); every other metric (mCE, AUPR,
    per-corruption CE, token cosine, ...) as one line per metric below it."""
    if summary.empty:
        return "(no results)"
    df = summary.copy()
    df["cell"] = df.apply(_cell, axis=1)
    norms = df["norm"].fillna("").astype(str) if "norm" in df.columns else pd.Series("", index=df.index)
    df["eps"] = [eps_text(e, n) for e, n in zip(df["eps"], norms)]
    keys = [c for c in ("model", "protocol", "benchmark", "attack", "eps") if c in df.columns]
    if "condition" in df.columns and df["condition"].fillna("").astype(str).ne("").any():
        df["condition"] = df["condition"].fillna("").astype(str)
        keys.append("condition")
    acc = df[df["metric"].isin(["top1", "top5"])]
    other = df[~df["metric"].isin(["top1", "top5", *EVIDENCE_METRICS, *CONVERGE_METRICS])]  # evidence_text / converge
    parts = []
    if len(acc):
        wide = acc.pivot_table(index=keys, columns="metric", values="cell", aggfunc="first", sort=False)
        wide["n"] = acc.groupby(keys, sort=False)["n"].max()
        parts.append(accuracy_legend(acc) + "\n" + wide.reset_index().to_string(index=False))
    if len(other):
        okeys = [k for k in keys if k not in ("attack", "eps", "condition")] + ["metric"]
        cols = okeys + (["condition"] if "condition" in keys else []) + ["cell", "n"]
        parts.append(other[cols].rename(columns={"cell": "value"}).to_string(index=False))
    note = skipped_note(summary)
    return "\n\n".join(parts + ([note] if note else []))


def accuracy_legend(acc: pd.DataFrame) -> str:
    """What the accuracy table's cells are and which settings each attack ran with (a bare ``pgd`` row says
    neither its steps nor its step size)."""
    lines = ["top1 / top5: accuracy in % [95% Wilson interval]; n: samples"]
    if "setting" in acc.columns:
        # the ladder's settings are the converge block's below; "fgsm = FGSM" says nothing
        seen = acc[~acc["attack"].astype(str).isin(["clean", "converge"])].drop_duplicates(["attack", "setting"])
        lines += [f"  {a} = {s if len(s) <= 160 else s[:157] + '...'}"
                  for a, s in zip(seen["attack"].astype(str), seen["setting"].fillna("").astype(str))
                  if s and s.lower() != a.lower()]
    return "\n".join(lines)


def skipped_note(summary: pd.DataFrame) -> str:
    """One line saying how many unreadable images were skipped (``n_skipped``), or ''."""
    if "n_skipped" not in summary.columns:
        return ""
    n = int(pd.to_numeric(summary["n_skipped"], errors="coerce").fillna(0).max())
    if n <= 0:
        return ""
    return (f"note: {n} unreadable image(s) were skipped (--skip-unreadable), so n counts only the images that "
            f"could be read (column n_skipped in summary.csv; their paths are in run.json)")


PERCENT_METRICS = ("top1", "top5", "mce", "relative_mce", "aupr", "auroc", "fpr95", "mean_err")


def _cell(r: pd.Series) -> str:
    """Percentages with one-decimal intervals; other metrics (e.g. token_cosine) with 4 digits."""
    pct = str(r["metric"]) in PERCENT_METRICS or str(r["metric"]).startswith(("ce_", "err_"))
    v = f"{r['value']:6.2f}" if pct else f"{r['value']:.4f}"
    if pd.notna(r.get("ci_low")) and pd.notna(r.get("ci_high")):
        lo, hi = (f"{r['ci_low']:5.1f}", f"{r['ci_high']:5.1f}") if pct else (f"{r['ci_low']:.4f}", f"{r['ci_high']:.4f}")
        return f"{v} [{lo}, {hi}]"
    return v
