"""``--trace``: every attacked sample's loss per iterate, moved out of the records into a compact
``trace.parquet`` in the run folder (long format: one row per sample and iterate, float32), so the
records stay small and a user can plot a condition's loss curves with one groupby."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .run_files import write_parquet_atomic

TRACE_COLUMN = "loss_trace"  # in the unit records: one array per sample (None: not attacked)
TRACE_FILE = "trace.parquet"


def trace_frame(records: pd.DataFrame) -> pd.DataFrame:
    """(unit, attack, eps, params, condition, sample_id, iteration, loss) rows; the last iterate of
    a sample is its returned point (the attack's loss, higher = more adversarial)."""
    keep = [c for c in ("unit", "attack", "eps", "params", "condition", "sample_id") if c in records.columns]
    has = records[TRACE_COLUMN].map(lambda v: isinstance(v, (list, tuple, np.ndarray)) and len(v) > 0)
    r = records.loc[has, keep + [TRACE_COLUMN]]
    if r.empty:
        return pd.DataFrame(columns=keep + ["iteration", "loss"])
    lengths = r[TRACE_COLUMN].map(len).to_numpy()
    out = r[keep].loc[r.index.repeat(lengths)].reset_index(drop=True)
    out["iteration"] = np.concatenate([np.arange(k, dtype=np.int32) for k in lengths])
    out["loss"] = np.concatenate([np.asarray(v, dtype=np.float32) for v in r[TRACE_COLUMN]])
    for c in ("attack", "params", "condition", "unit"):
        if c in out.columns:
            out[c] = out[c].astype("category")
    return out


def split_trace(records: pd.DataFrame, out: Path) -> pd.DataFrame:
    """``records`` without the trace column; the trace (if any) written to ``out/trace.parquet``."""
    if TRACE_COLUMN not in records.columns:
        (Path(out) / TRACE_FILE).unlink(missing_ok=True)  # none of an earlier finalize left behind
        return records
    write_parquet_atomic(trace_frame(records), Path(out) / TRACE_FILE)
    return records.drop(columns=[TRACE_COLUMN])
