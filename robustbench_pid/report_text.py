"""Plain-text rendering of summaries for the terminal."""
from __future__ import annotations

import pandas as pd


def eps_label(eps: float) -> str:
    """0.0117647 -> '3/255'; other values as %g."""
    if eps == 0:
        return "0"
    k = round(eps * 255)
    if k > 0 and abs(k / 255 - eps) < 1e-9:
        return f"{k}/255"
    return f"{eps:g}"


def format_summary(summary: pd.DataFrame) -> str:
    """One line per (model, protocol, benchmark, attack, eps): metric value [95% interval]."""
    if summary.empty:
        return "(no results)"
    df = summary.copy()
    df["cell"] = df.apply(lambda r: f"{r['value']:6.2f} [{r['ci_low']:5.1f}, {r['ci_high']:5.1f}]"
                          if pd.notna(r.get("ci_low")) else f"{r['value']:6.2f}", axis=1)
    df["eps"] = df["eps"].map(eps_label)
    keys = [c for c in ("model", "protocol", "benchmark", "attack", "eps") if c in df.columns]
    wide = df.pivot_table(index=keys, columns="metric", values="cell", aggfunc="first", sort=False)
    n = df.groupby(keys, sort=False)["n"].max()
    wide["n"] = n
    wide = wide.reset_index()
    return wide.to_string(index=False)
