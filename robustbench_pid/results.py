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
from .conditions import add_identity, combined, samples_id
from .metrics import wilson_interval

TIDY_COLUMNS = ["run_id", "model", "checkpoint_sha256", "dataset", "protocol", "benchmark", "attack", "eps",
                "setting", "metric", "value", "n", "ci_low", "ci_high", "settings_id", "samples_id", "precision",
                "settings"]
ID_COLUMNS = ["run_id", "model", "checkpoint_sha256", "dataset", "protocol", "benchmark"]


def accuracy_rows(records: pd.DataFrame, group_cols: Iterable[str] = ("attack", "eps"),
                  metrics: Iterable[str] = ("top1", "top5")) -> pd.DataFrame:
    """top-1/top-5 accuracy in percent with 95% Wilson intervals, per group.

    Conditions with different settings (``settings_id``) are never pooled, even at one attack
    name and eps; each row names the sample set it was computed on (``samples_id``)."""
    ident = [c for c in ("settings_id", "setting", "settings", "precision") if c in records.columns]
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


def summarize(records: pd.DataFrame, ce_baseline: Optional[str] = None) -> pd.DataFrame:
    """Tidy rows for whatever benchmarks the records hold.

    ``ce_baseline`` names the model whose corruption errors normalize CE/mCE outside ImageNet
    (its records must be in the same store); ImageNet uses AlexNet's published errors.
    """
    from .benchmarks import get_benchmark

    records = add_identity(records)
    parts = []
    for b, g in records.groupby("benchmark", sort=False):
        bench = get_benchmark(b)
        takes = "ce_baseline" in inspect.signature(bench.summarize).parameters
        part = bench.summarize(g, ce_baseline=ce_baseline) if takes else bench.summarize(g)
        parts.append(_identify_aggregates(part, g))
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


def _identify_aggregates(rows: pd.DataFrame, records: pd.DataFrame) -> pd.DataFrame:
    """Rows a benchmark derived from many conditions (mCE, AUPR, per-layer statistics) get the
    combined identity of the conditions of their run and the sample set those cover."""
    if rows.empty or "run_id" not in rows.columns:
        return rows
    rows = rows.copy()
    for col in ("settings_id", "setting", "settings", "samples_id"):
        if col not in rows.columns:
            rows[col] = None
    todo = rows["settings_id"].isna()
    if not todo.any():
        return rows
    for run, g in records.groupby("run_id", sort=False):
        m = todo & (rows["run_id"] == run)
        if not m.any():
            continue
        parts = sorted(set(g["settings_id"].astype(str)))
        rows.loc[m, "settings_id"] = parts[0] if len(parts) == 1 else combined(parts)
        rows.loc[m, "setting"] = str(g["benchmark"].iloc[0]) + (f" over {len(parts)} conditions" if len(parts) > 1 else "")
        rows.loc[m, "settings"] = "+".join(parts)
        rows.loc[m, "samples_id"] = samples_id(g["sample_id"]) if "sample_id" in g.columns else None
    return rows


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


def with_run_identity(records: pd.DataFrame, info: dict) -> pd.DataFrame:
    """Records of a run folder written before they carried their identity: the precision comes
    from the run's run.json, then the settings identity is derived as for new records."""
    if "precision" not in records.columns:
        records = records.assign(precision=str(info.get("precision") or "fp32"))
    return add_identity(records)


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
            frames.append(with_run_identity(pd.read_parquet(d / "records.parquet"), info))
    if not frames:
        raise UserError(f"no complete runs under {path}")
    return pd.concat(frames, ignore_index=True)


def load_results(path: Union[str, Path], ce_baseline: Optional[str] = None) -> pd.DataFrame:
    """Tidy DataFrame: one row per (run, model, dataset, attack, eps, metric), values in percent."""
    return summarize(load_records(path), ce_baseline=ce_baseline)
