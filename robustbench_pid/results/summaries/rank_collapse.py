"""Tidy rows of the ``rank-collapse`` benchmark: one per layer, ``metric`` = ``token_cosine``,
``value`` = mean over images (a cosine, not a percentage) with a 95% normal interval of the mean."""
from __future__ import annotations

import math
from typing import List, Optional

import pandas as pd

from . import summarizers
from .accuracy import ID_COLUMNS


@summarizers.register("rank-collapse")
def token_cosine_rows(records: pd.DataFrame, ce_baseline: Optional[str] = None) -> pd.DataFrame:
    """Mean token cosine per (run, model, ..., layer) with a 95% normal interval of the mean."""
    recs = records[records["metric"] == "token_cosine"] if "metric" in records.columns else records
    keys = [c for c in ID_COLUMNS if c in recs.columns] + ["layer"]
    rows: List[dict] = []
    for gkey, g in recs.groupby(keys, sort=True, dropna=False):
        base = dict(zip(keys, gkey if isinstance(gkey, tuple) else (gkey,)))
        v = g["value"].astype("float64")
        n = int(v.notna().sum())
        mean = float(v.mean())
        half = 1.959963984540054 * float(v.std(ddof=1)) / math.sqrt(n) if n > 1 else float("nan")
        layer = int(base.pop("layer"))
        rows.append({**base, "attack": "clean", "eps": 0.0, "metric": "token_cosine", "value": mean, "n": n,
                     "ci_low": mean - half, "ci_high": mean + half, "layer": layer, "condition": f"layer={layer:02d}"})
    return pd.DataFrame(rows)
