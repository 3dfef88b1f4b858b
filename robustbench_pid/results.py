"""Per-sample records -> tidy results. Records are the truth; every table is computed from them.

A run folder holds ``records.parquet`` (one row per evaluated sample and condition),
``run.json`` (provenance; ``status`` is ``complete`` only after everything was written) and
``summary.csv`` (the tidy rows, written last).
"""
from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Iterable, List, Optional, Union

import pandas as pd

from .errors import UserError
from .metrics import wilson_interval

TIDY_COLUMNS = ["run_id", "model", "checkpoint_sha256", "dataset", "protocol", "benchmark", "attack", "eps",
                "metric", "value", "n", "ci_low", "ci_high"]
ID_COLUMNS = ["run_id", "model", "checkpoint_sha256", "dataset", "protocol", "benchmark"]


def accuracy_rows(records: pd.DataFrame, group_cols: Iterable[str] = ("attack", "eps"),
                  metrics: Iterable[str] = ("top1", "top5")) -> pd.DataFrame:
    """top-1/top-5 accuracy in percent with 95% Wilson intervals, per group."""
    keys = [c for c in ID_COLUMNS if c in records.columns] + list(group_cols)
    rows: List[dict] = []
    for gkey, g in records.groupby(keys, sort=False, dropna=False):
        base = dict(zip(keys, gkey if isinstance(gkey, tuple) else (gkey,)))
        for m in metrics:
            col = f"correct_{m}"
            if col not in g or g[col].isna().all():
                continue
            k, n = int(g[col].sum()), int(g[col].notna().sum())
            lo, hi = wilson_interval(k, n)
            rows.append({**base, "metric": m, "value": 100.0 * k / n, "n": n,
                         "ci_low": 100.0 * lo, "ci_high": 100.0 * hi})
    return pd.DataFrame(rows)


def summarize(records: pd.DataFrame, ce_baseline: Optional[str] = None) -> pd.DataFrame:
    """Tidy rows for whatever benchmarks the records hold.

    ``ce_baseline`` names the model whose corruption errors normalize CE/mCE outside ImageNet
    (its records must be in the same store); ImageNet uses AlexNet's published errors.
    """
    from .benchmarks import get_benchmark

    parts = []
    for b, g in records.groupby("benchmark", sort=False):
        bench = get_benchmark(b)
        takes = "ce_baseline" in inspect.signature(bench.summarize).parameters
        parts.append(bench.summarize(g, ce_baseline=ce_baseline) if takes else bench.summarize(g))
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=TIDY_COLUMNS)
    df = pd.concat(parts, ignore_index=True)
    front = [c for c in TIDY_COLUMNS if c in df.columns]
    return add_skipped_column(df[front + [c for c in df.columns if c not in front]], records)


def add_skipped_column(summary: pd.DataFrame, records: pd.DataFrame) -> pd.DataFrame:
    """``n_skipped``: images ``--skip-unreadable`` dropped from the run each row belongs to, so a
    reader of the table sees that ``n`` shrank. Only for records that can say (image-file datasets)."""
    if "skipped_unreadable" not in records.columns or summary.empty:
        return summary
    counts = records["skipped_unreadable"].fillna(0)
    if "run_id" in records.columns and "run_id" in summary.columns:
        per_run = counts.groupby(records["run_id"]).max()
        n = summary["run_id"].map(per_run).fillna(0)
    else:
        n = pd.Series(counts.max(), index=summary.index)
    out = summary.copy()
    out.insert(list(out.columns).index("n") + 1 if "n" in out.columns else len(out.columns), "n_skipped",
               n.astype(int))
    return out


def _run_dirs(path: Union[str, Path]) -> List[Path]:
    p = Path(path)
    if not p.exists():
        raise UserError(f"results path not found: {p}")
    if (p / "run.json").is_file():
        return [p]
    runs = sorted(d.parent for d in p.rglob("run.json"))
    if not runs:
        raise UserError(f"no run folders (with run.json) under {p}")
    return runs


def load_run_info(run_dir: Union[str, Path]) -> dict:
    return json.loads((Path(run_dir) / "run.json").read_text())


def load_records(path: Union[str, Path], include_incomplete: bool = False) -> pd.DataFrame:
    """Per-sample records of one run folder or of every complete run under a folder."""
    frames = []
    for d in _run_dirs(path):
        info = load_run_info(d)
        if info.get("status") != "complete" and not include_incomplete:
            if Path(path) == d:
                raise UserError(f"{d}: run is not complete (status {info.get('status')!r}); re-run the same "
                                f"command to finish it (sharded runs: `robustbench-pid merge {d}` once every "
                                f"shard has finished)")
            continue
        if (d / "records.parquet").is_file():
            frames.append(pd.read_parquet(d / "records.parquet"))
    if not frames:
        raise UserError(f"no complete runs under {path}")
    return pd.concat(frames, ignore_index=True)


def load_results(path: Union[str, Path], ce_baseline: Optional[str] = None) -> pd.DataFrame:
    """Tidy DataFrame: one row per (run, model, dataset, attack, eps, metric), values in percent."""
    return summarize(load_records(path), ce_baseline=ce_baseline)
