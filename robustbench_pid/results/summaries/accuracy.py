"""Rows every benchmark shares: top-1/top-5 accuracy with Wilson intervals, and the count of
images a run dropped as unreadable."""
from __future__ import annotations

from typing import Iterable, List

import pandas as pd

from ..conditions import META_COLUMNS, samples_id
from ..stats.metrics import wilson_interval

# a run's identity: rows of different runs are never pooled
ID_COLUMNS = ["run_id", "model", "checkpoint_sha256", "dataset", "protocol", "benchmark", "checkpoint_name",
              "checkpoint_published_hash"]


def accuracy_rows(records: pd.DataFrame, group_cols: Iterable[str] = ("attack", "eps"),
                  metrics: Iterable[str] = ("top1", "top5")) -> pd.DataFrame:
    """top-1/top-5 accuracy in percent with 95% Wilson intervals, per group.

    Conditions with different settings (``settings_id``) are never pooled, even at one attack
    name and eps; each row names the sample set it was computed on (``samples_id``) and carries
    the attack metadata of its condition (``conditions.META_COLUMNS``)."""
    ident = [c for c in ("settings_id", "setting", "settings", "precision") + META_COLUMNS if c in records.columns]
    keys = [c for c in ID_COLUMNS if c in records.columns] + list(group_cols) + ident
    rows: List[dict] = []
    for gkey, g in records.groupby(keys, sort=False, dropna=False):
        base = dict(zip(keys, gkey if isinstance(gkey, tuple) else (gkey,)))
        if "sample_id" in g.columns:
            base["samples_id"] = samples_id(g["sample_id"])
        for m in metrics:
            col = f"correct_{m}"
            if col not in g or g[col].isna().all():
                continue
            k, n = int(g[col].sum()), int(g[col].notna().sum())
            lo, hi = wilson_interval(k, n)
            rows.append({**base, "metric": m, "value": 100.0 * k / n, "n": n,
                         "ci_low": 100.0 * lo, "ci_high": 100.0 * hi})
    return pd.DataFrame(rows)


def skipped_rows(records: pd.DataFrame) -> pd.DataFrame:
    """One ``skipped_unreadable`` row per run: how many images --skip-unreadable dropped."""
    if "skipped_unreadable" not in records:
        return pd.DataFrame()
    keys = [c for c in ID_COLUMNS if c in records.columns]
    rows = []
    for gkey, g in records.groupby(keys, sort=False, dropna=False):
        base = dict(zip(keys, gkey if isinstance(gkey, tuple) else (gkey,)))
        rows.append({**base, "attack": "all", "eps": 0.0, "metric": "skipped_unreadable",
                     "value": float(g["skipped_unreadable"].max()), "n": int(g["sample_id"].nunique()),
                     "ci_low": float("nan"), "ci_high": float("nan")})
    return pd.DataFrame(rows)


def concat_rows(parts: List[pd.DataFrame]) -> pd.DataFrame:
    """The non-empty parts, concatenated (an empty frame when none)."""
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
