"""A RobustBench entry's published numbers beside this run's (``--model robustbench:NAME``): the leaderboard's clean
and AutoAttack accuracy (and its external evaluation, where one found less) from the pinned model_info table
(``core/robustbench.py`` ``published``), this run's clean, AutoAttack and converged values on its own samples, and
the paired difference AutoAttack - converged over those same samples (per sample; Bonett-Price interval, exact
McNemar p). What is comparable is said, not assumed: the leaderboard's numbers are on its whole sample set; this
run's are on the samples it ran (run.json's leaderboard provenance says whether they are the same, and why not).
Pandas only (the result side)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np
import pandas as pd

from ...core import robustbench as rb
from ...core.labels import eps_text

PREFIX = "robustbench:"
AUTOATTACK = {"Linf": ("autoattack", "linf"), "L2": ("autoattack_l2", "l2")}


def entry_of(model: str) -> Optional[tuple]:
    """(threat, name) of a ``robustbench:[THREAT/]NAME`` model, else None."""
    if not isinstance(model, str) or not model.startswith(PREFIX):
        return None
    threat, _, name = model[len(PREFIX):].rpartition("/")
    return threat or "Linf", name


def _top1(summary: pd.DataFrame, attack: str, norm: Optional[str] = None) -> pd.DataFrame:
    rows = summary[(summary["attack"] == attack) & (summary["metric"] == "top1")]
    if norm is not None and "norm" in rows.columns:
        rows = rows[rows["norm"].fillna("linf").astype(str) == norm]
    return rows


def compare(summary: pd.DataFrame, records: pd.DataFrame, info: Optional[Dict[str, Any]] = None
            ) -> List[Dict[str, Any]]:
    """Per robustbench: model and AutoAttack eps of the run: the published and measured numbers (see the module
    docstring); [] for other runs."""
    if summary.empty or "model" not in summary.columns:
        return []
    out, corrupted = [], []
    for model in sorted(set(summary["model"].astype(str))):
        got = entry_of(model)
        if got is None:
            continue
        threat, name = got
        dataset = str(summary["dataset"].iloc[0])
        dataset = "imagenet" if dataset.startswith("imagenet") else rb.board_dataset(dataset)
        if threat == "corruptions":
            from .leaderboard_corruptions import compare_corruptions

            corrupted.append(compare_corruptions(model, name, dataset, summary, records, info))
            continue
        pub = rb.published(dataset, threat, name) if threat in AUTOATTACK else None
        s = summary[summary["model"].astype(str) == model]
        clean = _top1(s[s["benchmark"] == "adversarial"], "clean")
        attack, norm = AUTOATTACK.get(threat, ("autoattack", "linf"))
        aa = _top1(s[s["benchmark"] == "adversarial"], attack)
        for _, a in (aa.iterrows() if len(aa) else iter([(None, None)])):
            row: Dict[str, Any] = {"model": model, "dataset": dataset, "threat": threat, "published": pub,
                                   "clean": float(clean["value"].iloc[0]) if len(clean) else float("nan"),
                                   "n": int(a["n"]) if a is not None else int(clean["n"].iloc[0]) if len(clean) else 0,
                                   "eps": float(a["eps"]) if a is not None else float("nan"),
                                   "autoattack": float(a["value"]) if a is not None else float("nan")}
            conv = _top1(s, "converge", norm)
            if a is not None and len(conv):
                conv = conv[np.isclose(conv["eps"].astype(float), float(a["eps"]), rtol=0, atol=1e-9)]
            if a is not None and len(conv):
                row["converged"], row["status"] = float(conv["value"].iloc[0]), str(conv["status"].iloc[0])
                row.update(_paired(records, model, attack, float(a["eps"]), norm))
            out.append(row)
    lb = (info or {}).get("leaderboard") or {}
    for row in out:
        row["comparable"] = bool(lb.get("comparable")) and lb.get("eps") == (
            eps_text(row["eps"], AUTOATTACK.get(row["threat"], ("", "linf"))[1]) if np.isfinite(row["eps"]) else None)
        row["reasons"] = list(lb.get("reasons") or []) if lb else [f"not run with --suite {rb.NAME} (the leaderboard's "
                                                                   f"eps and sample set)"]
    return out + corrupted


def _paired(records: pd.DataFrame, model: str, attack: str, eps: float, norm: str) -> Dict[str, Any]:
    """AutoAttack - converged over the samples both attacked: discordant counts, difference, interval, p."""
    from ..stats.stats import mcnemar_from_counts, paired_difference_interval

    r = records[records["model"].astype(str) == model]
    at = r[np.isclose(r["eps"].astype(float), eps, rtol=0, atol=1e-9)]
    a = at[at["attack"] == attack].set_index("sample_id")["correct_top1"].astype(bool)
    c = at[at["attack"] == "converge"]
    if "norm" in c.columns:
        c = c[c["norm"].fillna("linf").astype(str) == norm]
    c = c.set_index("sample_id")["correct_top1"].astype(bool)
    both = a.index.intersection(c.index)
    a, c = a.loc[both], c.loc[both]
    only_aa, only_conv, n = int((a & ~c).sum()), int((~a & c).sum()), len(both)
    if not n:
        return {}
    lo, hi = paired_difference_interval(only_conv, only_aa, n)  # accuracy(AutoAttack) - accuracy(converged)
    return {"paired_n": n, "only_autoattack_robust": only_aa, "only_converged_robust": only_conv,
            "difference": 100.0 * (only_aa - only_conv) / n, "difference_ci": (lo, hi),
            "pvalue": mcnemar_from_counts(only_aa, only_conv, n).pvalue}


def format_leaderboard(summary: pd.DataFrame, records: pd.DataFrame, info: Optional[Dict[str, Any]] = None) -> str:
    """The comparison as text (the evaluate command prints it under the converge table)."""
    parts = []
    for row in compare(summary, records, info):
        if row["threat"] == "corruptions":
            from .leaderboard_corruptions import format_corruptions

            parts.append(format_corruptions(row))
            continue
        pub = row["published"]
        head = f"RobustBench: {row['model']} ({row['dataset']} {row['threat']})"
        if pub is None:
            parts.append(f"{head}: the pinned model_info table ({rb.entries_source()}) has no entry for it")
            continue
        eps = eps_text(row["eps"], AUTOATTACK[row["threat"]][1]) if np.isfinite(row["eps"]) else "-"
        lines = [f"{head}, published by RobustBench at eps {pub.get('eps', '-')} ({rb.entries_source()}) beside "
                 f"this run at eps {eps}:",
                 _table(row, pub)]
        if "difference" in row:
            lo, hi = row["difference_ci"]
            lines.append(f"paired difference AutoAttack - converged on the same {row['paired_n']:,} samples: "
                         f"{row['difference']:+.2f} pt [{lo:+.1f}, {hi:+.1f}] (robust under AutoAttack only: "
                         f"{row['only_autoattack_robust']}, under the ladder only: {row['only_converged_robust']}; "
                         f"McNemar p = {row['pvalue']:.3g}); the ladder's status: {row['status']}")
        if row["comparable"]:
            lines.append("comparable: this run is the leaderboard's protocol on its whole sample set")
        else:
            lines.append("not comparable with the published numbers: " + "; ".join(row["reasons"]) +
                         " (the published numbers are on the leaderboard's whole sample set)")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def _table(row: Dict[str, Any], pub: Dict[str, Any]) -> str:
    def num(v: Any) -> str:
        return "-" if v is None or (isinstance(v, float) and not np.isfinite(v)) else f"{float(v):.2f}"

    t = pd.DataFrame([
        {"": "published", "clean": num(pub.get("clean_acc")), "AutoAttack": num(pub.get("autoattack_acc")),
         "external / converged": num(pub.get("external")), "n": "leaderboard's"},
        {"": "this run", "clean": num(row["clean"]), "AutoAttack": num(row["autoattack"]),
         "external / converged": num(row.get("converged")), "n": f"{row['n']:,}"}])
    return t.to_string(index=False)
