"""Tidy rows of the evidence that each attack worked, per condition: mean passes per attacked sample,
the share of attacked samples flagged by each indicator of attack failure, and the precision
agreement. Pandas only (the records carry everything; see ``indicators`` for the definitions).

Rows (metric names): ``passes_forward``, ``passes_backward`` (mean per attacked sample, not percent),
each of ``indicators.INDICATORS`` (percent of attacked samples, 95% Wilson interval; a rise is the
regression ``check`` looks for), ``agreement`` (percent of checked verdicts that agree with fp32
eager). Without ``--indicators`` only the indicators the telemetry decides (silent success,
unavailable gradients) get rows; with it, an indicator that cannot be computed gets a row with
value NaN, n 0 and the reason in ``note``: never a 0 that looks like a clean bill of health.
"""
from __future__ import annotations

from typing import Dict, Iterator, List, Tuple

import numpy as np
import pandas as pd

from ..conditions import META_COLUMNS, samples_id
from .indicators import AGREEMENT_WARN, INDICATORS, UNCONSTRAINED, sample_flags, why_missing
from ..stats.metrics import wilson_interval
from ..summaries.accuracy import ID_COLUMNS

EVIDENCE_METRICS = ("passes_forward", "passes_backward", *INDICATORS, "agreement")


def _groups(records: pd.DataFrame) -> Iterator[Tuple[Dict, pd.DataFrame]]:
    """The conditions of ``records``, keyed as ``summaries.accuracy.accuracy_rows`` keys them."""
    ident = [c for c in ("settings_id", "setting", "settings", "precision") + META_COLUMNS if c in records.columns]
    keys = [c for c in ID_COLUMNS if c in records.columns] + ["attack", "eps"] + ident
    for gkey, g in records.groupby(keys, sort=False, dropna=False):
        base = dict(zip(keys, gkey if isinstance(gkey, tuple) else (gkey,)))
        if "sample_id" in g.columns:
            base["samples_id"] = samples_id(g["sample_id"])
        yield base, g


def _share_row(base: Dict, metric: str, flags: pd.Series) -> Dict:
    known = flags.dropna()
    k, n = int(known.sum()), int(len(known))
    lo, hi = wilson_interval(k, n)
    return {**base, "metric": metric, "value": 100.0 * k / n, "n": n, "ci_low": 100.0 * lo, "ci_high": 100.0 * hi}


def evidence_rows(records: pd.DataFrame) -> pd.DataFrame:
    """The evidence rows of the attack conditions in ``records`` (none for records without telemetry)."""
    if records.empty or "passes_forward" not in records.columns:
        return pd.DataFrame()
    adv = records[records["attack"].astype(str) != "clean"]
    if adv.empty:
        return pd.DataFrame()
    flags = sample_flags(adv)

    def ran_indicators(r: pd.DataFrame) -> bool:  # --indicators was given for these records' run
        return bool(("loss_variation" in r.columns and r["loss_variation"].notna().any()) or
                    ("condition" in r.columns and (r["condition"].astype(str) == UNCONSTRAINED).any()))

    by_run = ({rid: ran_indicators(r) for rid, r in adv.groupby("run_id", sort=False)} if "run_id" in adv.columns
              else {None: ran_indicators(adv)})
    rows: List[Dict] = []
    for base, g in _groups(adv):
        indicators_run = by_run.get(g["run_id"].iloc[0] if "run_id" in g.columns else None, False)
        att = g[g["attacked"].astype(bool)] if "attacked" in g.columns else g
        if "condition" in g.columns and (g["condition"].astype(str) == UNCONSTRAINED).any():
            base = {**base, "condition": UNCONSTRAINED}
        for m in ("passes_forward", "passes_backward"):
            v = pd.to_numeric(att[m], errors="coerce").dropna()
            rows.append({**base, "metric": m, "value": float(v.mean()) if len(v) else np.nan, "n": int(len(v)),
                         "ci_low": np.nan, "ci_high": np.nan})
        for ind in INDICATORS:
            f = flags.loc[att.index, ind]
            if f.notna().any():
                rows.append(_share_row(base, ind, f))
            elif indicators_run:  # asked for and not computable: say why (without --indicators: no row)
                rows.append({**base, "metric": ind, "value": np.nan, "n": 0, "ci_low": np.nan, "ci_high": np.nan,
                             "note": why_missing(ind, g, indicators_run)})
        if "agreement" in g.columns and pd.to_numeric(g["agreement"], errors="coerce").notna().any():
            row = _share_row(base, "agreement", pd.to_numeric(g["agreement"], errors="coerce"))
            if row["value"] < 100 * AGREEMENT_WARN:
                row["note"] = (f"warning: only {row['value']:.1f}% of the verdicts checked in fp32 eager agree "
                               f"(threshold {100 * AGREEMENT_WARN:.0f}%): the faster precision/compilation changed "
                               f"results; report fp32 numbers")
            rows.append(row)
    return pd.DataFrame(rows)
