"""Tidy rows of the ``ood`` benchmark (ImageNet-O): in-distribution accuracy, the unreadable-image
count, and per run ``aupr``, ``auroc``, ``fpr95`` and ``chance_aupr`` of the anomaly score (OOD is
the positive class; ``robustbench_pid.results.stats.metrics.ood_detection_metrics``)."""
from __future__ import annotations

import warnings
from typing import Optional

import pandas as pd

from ..stats.metrics import ood_detection_metrics
from . import summarizers
from .accuracy import ID_COLUMNS, accuracy_rows, concat_rows, skipped_rows


@summarizers.register("ood")
def ood_rows(records: pd.DataFrame, ce_baseline: Optional[str] = None) -> pd.DataFrame:
    parts = [accuracy_rows(records[~records["ood"].astype(bool)], ("attack", "eps")), skipped_rows(records)]
    keys = [c for c in ID_COLUMNS if c in records.columns]
    rows = []
    for gkey, g in records.groupby(keys, sort=False, dropna=False):
        base = dict(zip(keys, gkey if isinstance(gkey, tuple) else (gkey,)))
        is_ood = g["ood"].astype(bool)
        if is_ood.all() or not is_ood.any():
            warnings.warn("ImageNet-O records hold only one class (in or OOD): no AUPR/AUROC; evaluate "
                          "both parts (use --subset, not --limit)")
            continue
        m = ood_detection_metrics(g.loc[~is_ood, "score"], g.loc[is_ood, "score"])
        for k in ("aupr", "auroc", "fpr95", "chance_aupr"):
            rows.append({**base, "attack": "ood", "eps": 0.0, "metric": k, "value": m[k], "n": len(g),
                         "ci_low": float("nan"), "ci_high": float("nan")})
    parts.append(pd.DataFrame(rows))
    return concat_rows(parts)
