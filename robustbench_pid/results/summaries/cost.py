"""Tidy rows of the ``cost`` benchmark (RPC Table 13): one per metric (parameters, multiply-adds per
sample as MACs and as FLOPs, seconds per sample for inference and forward+backward, peak memory in
MiB), ``n`` = the batch size it was measured at, no interval (one measurement), ``device_name`` the
device it belongs to, ``value_unit`` and ``convention`` what the value counts and how (from the records;
runs written before they were recorded get empty ones)."""
from __future__ import annotations

from typing import List, Optional

import pandas as pd

from . import summarizers
from .accuracy import ID_COLUMNS


@summarizers.register("cost")
def cost_rows(records: pd.DataFrame, ce_baseline: Optional[str] = None) -> pd.DataFrame:
    keys = [c for c in ID_COLUMNS if c in records.columns] + ["metric"]
    rows: List[dict] = []
    for gkey, g in records.groupby(keys, sort=False, dropna=False):
        base = dict(zip(keys, gkey if isinstance(gkey, tuple) else (gkey,)))
        rows.append({**base, "attack": "clean", "eps": 0.0, "value": float(g["value"].iloc[0]),
                     "n": int(g["batch_size"].iloc[0]), "ci_low": float("nan"), "ci_high": float("nan"),
                     "device_name": str(g["device_name"].iloc[0]), "condition": "",
                     "value_unit": str(g["value_unit"].iloc[0]) if "value_unit" in g else "",
                     "convention": str(g["convention"].iloc[0]) if "convention" in g else ""})
    return pd.DataFrame(rows)
