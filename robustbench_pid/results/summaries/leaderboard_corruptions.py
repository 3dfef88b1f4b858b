"""A ``robustbench:corruptions/NAME`` entry's published numbers beside this run's: the leaderboard's ``clean_acc``
and ``corruptions_acc`` (and ``corruptions_mce`` where it has one) from the pinned model_info table, this run's
values, and per cell the paired difference clean - corrupted over the same test images (their discordant counts,
Bonett-Price interval): how much each corruption and severity costs this model, image by image. The published
numbers are on the leaderboard's whole cells; run.json's leaderboard provenance says whether this run's are too.
Pandas only (the result side)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np
import pandas as pd

from ...core import robustbench as rb


def compare_corruptions(model: str, name: str, dataset: str, summary: pd.DataFrame, records: pd.DataFrame,
                        info: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The comparison row of one corruptions entry (see the module docstring)."""
    s = summary[(summary["model"].astype(str) == model) & (summary["benchmark"] == "robustbench_corruptions")]

    def value(attack: str, metric: str) -> float:
        rows = s[(s["attack"] == attack) & (s["metric"] == metric)]
        return float(rows["value"].iloc[0]) if len(rows) else float("nan")

    lb = (info or {}).get("leaderboard") or {}
    ok = bool(lb.get("comparable")) and lb.get("threat_model") == "corruptions"
    reasons = list(lb.get("reasons") or []) if lb.get("threat_model") == "corruptions" else [
        "not run with --suite robustbench-corruptions (the leaderboard's released data and n per cell)"]
    return {"model": model, "dataset": dataset, "threat": "corruptions", "published": rb.published(
                dataset, "corruptions", name),
            "clean": value("clean", "top1"), "corruptions_acc": value("corruptions", "corruptions_acc"),
            "mce": value("corruptions", "mce"), "cells": paired_cells(records[records["model"].astype(str) == model]),
            "comparable": ok, "reasons": reasons}


def paired_cells(records: pd.DataFrame) -> List[Dict[str, Any]]:
    """Per (corruption, severity) in RobustBench's order: the cell's accuracy and clean - cell over the images both
    scored (paired by image: the sample id after its condition, ``test/<index>`` or ``<wnid>/<file>``)."""
    from ..stats.stats import paired_difference_interval

    if records.empty or "corruption" not in records.columns:
        return []
    ids, conds = records["sample_id"].astype(str), records["condition"].astype(str)
    image = pd.Series([i[len(c) + 1:] if i.startswith(c + "/") else i for i, c in zip(ids, conds)],
                      index=records.index)  # the id after its condition: the same image in every condition
    clean = records[records["corruption"].fillna("") == ""].assign(image=image).set_index("image")["correct_top1"]
    out = []
    for c in rb.corruption_order():
        for sev in range(1, 6):
            m = (records["corruption"] == c) & (records["severity"].astype(int) == sev)
            if not m.any():
                continue
            cell = records[m].assign(image=image[m]).set_index("image")["correct_top1"].astype(bool)
            both = cell.index.intersection(clean.index)
            a, b = clean.loc[both].astype(bool), cell.loc[both]
            only_clean, only_cell, n = int((a & ~b).sum()), int((~a & b).sum()), len(both)
            row = {"corruption": c, "severity": sev, "accuracy": 100.0 * float(cell.mean()), "n": int(len(cell))}
            if n:
                lo, hi = paired_difference_interval(only_cell, only_clean, n)  # accuracy(clean) - accuracy(cell)
                row.update(paired_n=n, only_clean=only_clean, only_cell=only_cell,
                           drop=100.0 * (only_clean - only_cell) / n, drop_ci=(lo, hi))
            out.append(row)
    return out


def format_corruptions(row: Dict[str, Any]) -> str:
    """The comparison as text: published beside measured, then one line per corruption (its 5 cells)."""
    pub = row["published"]
    head = f"RobustBench: {row['model']} ({row['dataset']} corruptions)"
    if pub is None:
        return f"{head}: the pinned model_info table ({rb.entries_source()}) has no entry for it"

    def num(v: Any) -> str:
        return "-" if v is None or (isinstance(v, float) and not np.isfinite(v)) else f"{float(v):.2f}"

    n = max((c["n"] for c in row["cells"]), default=0)
    cols = {"": ["published", "this run"], "clean": [num(pub.get("clean_acc")), num(row["clean"])],
            "corruptions_acc": [num(pub.get("corruptions_acc")), num(row["corruptions_acc"])]}
    if pub.get("corruptions_mce") is not None or np.isfinite(row["mce"]):
        cols["mCE"] = [num(pub.get("corruptions_mce")), num(row["mce"])]
    cols["n per cell"] = ["leaderboard's", f"{n:,}"]
    lines = [f"{head}, published by RobustBench ({rb.entries_source()}) beside this run:",
             pd.DataFrame(cols).to_string(index=False)]
    if row["cells"]:
        lines.append("per cell: accuracy (%) at severity 1..5; clean - corrupted on the same images, paired, mean "
                     "over the 5 severities [95% interval of the worst severity]:")
        by: Dict[str, List[Dict[str, Any]]] = {}
        for c in row["cells"]:
            by.setdefault(c["corruption"], []).append(c)
        for c, cells in by.items():
            accs = " ".join(f"{x['accuracy']:6.2f}" for x in cells)
            drops = [x for x in cells if "drop" in x]
            if drops:
                worst = max(drops, key=lambda x: x["drop"])
                lo, hi = worst["drop_ci"]
                accs += (f"   drop {np.mean([x['drop'] for x in drops]):+6.2f} pt (worst s{worst['severity']} "
                         f"{worst['drop']:+.2f} [{lo:+.1f}, {hi:+.1f}])")
            lines.append(f"  {c:18} {accs}")
    if row["comparable"]:
        lines.append("comparable: this run is the leaderboard's protocol on its released data, whole cells")
    else:
        lines.append("not comparable with the published numbers: " + "; ".join(row["reasons"]) +
                     " (the published numbers are on the leaderboard's whole cells)")
    return "\n".join(lines)
