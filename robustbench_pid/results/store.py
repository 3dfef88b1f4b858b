"""Per-sample records -> tidy results. Records are the truth; every table is computed from them.

A run folder holds ``records.parquet`` (one row per evaluated sample and condition),
``run.json`` (provenance; ``status`` is ``complete`` only after everything was written) and
``summary.csv`` (the tidy rows, written last).
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import pandas as pd

from .conditions import META_COLUMNS, add_identity, combined, condition_meta, samples_id, with_attack_meta
from ..errors import UserError
from .summaries import summarize_benchmark
from .files.verify import verify_run_files

TIDY_COLUMNS = ["run_id", "model", "checkpoint_sha256", "dataset", "protocol", "benchmark", "attack", "eps",
                "setting", "metric", "value", "n", "ci_low", "ci_high", "settings_id", "samples_id", "precision",
                "settings", *META_COLUMNS]


def summarize(records: pd.DataFrame, ce_baseline: Optional[str] = None) -> pd.DataFrame:
    """Tidy rows for whatever benchmarks the records hold (pandas only: no model code is imported).

    ``ce_baseline`` names the model whose corruption errors normalize CE/mCE outside ImageNet
    (its records must be in the same store); ImageNet uses AlexNet's published errors. It is only
    ever this argument: nothing read from the environment changes the rows.
    """
    records = add_identity(records)
    parts = []
    for b, g in records.groupby("benchmark", sort=False):
        part = summarize_benchmark(str(b), g, ce_baseline=ce_baseline)
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
    combined identity of the conditions of their run and the sample set those cover, and the
    attack metadata of their ``attack`` (that of the records' condition of that name, else that
    of a benchmark condition: its name as label, no norm, not white box, no paper eps)."""
    if rows.empty:
        return rows
    rows = _with_row_meta(rows, records)
    if "run_id" not in rows.columns:
        return rows
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


def _with_row_meta(rows: pd.DataFrame, records: pd.DataFrame) -> pd.DataFrame:
    """Fills the metadata of rows that came without it (derived rows, e.g. ``err_fog``, ``aupr``)
    from the records' condition of the same name, never from the attack registry."""
    known: Dict[str, Dict[str, Any]] = {}
    if set(META_COLUMNS) <= set(records.columns):
        for r in records.drop_duplicates("attack")[["attack", *META_COLUMNS]].itertuples(index=False):
            known[str(r[0])] = dict(zip(META_COLUMNS, r[1:]))
    return with_attack_meta(rows.copy(), derive=lambda a: known.get(a) or condition_meta(a))


@dataclass
class LoadedRuns:
    """What :func:`load_runs` found: the records of the runs read, each run's run.json (plus its
    ``path``), and one note per run folder it left out (and why)."""

    records: pd.DataFrame
    runs: List[Dict[str, Any]] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


def _finish_hint(d: Path) -> str:
    return (f"re-run the same command to finish it (sharded runs: `robustbench-pid merge {d}` once every "
            f"shard has finished)")


def _run_dirs(path: Union[str, Path]) -> List[Path]:
    """The run folders (those holding a ``run.json``) at or under ``path``, sorted."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"results path not found: {p}")
    if (p / "run.json").is_file():
        return [p]
    runs = sorted(d.parent for d in p.rglob("run.json"))
    if not runs:
        raise UserError(f"no run folders (with run.json) under {p}; run `evaluate` first")
    return runs


def load_runs(path: Union[str, Path], include_incomplete: bool = False) -> LoadedRuns:
    """The records of one run folder, or of every complete run under a folder: the one place
    run folders are discovered and read.

    Policy for runs that are not complete (``run.json`` status other than ``complete``: still
    running, interrupted, or a shard waiting for ``merge``) and for run folders without records:

    - ``path`` is itself such a run folder: a UserError naming it and the fix (finish or merge it);
      you asked for exactly that run, and half of it would pass for all of it;
    - ``path`` is a folder of runs: those runs are left out and each gets a line in ``notes`` (the
      others are still worth reading); if none is left, a UserError listing them.

    ``include_incomplete=True`` reads the records an incomplete run has written so far.
    """
    p = Path(path)
    out = LoadedRuns(pd.DataFrame())
    frames = []
    for d in _run_dirs(p):
        info = load_run_info(d)
        status = info.get("status")
        if status != "complete" and not include_incomplete:
            if p == d:
                raise UserError(f"{d}: run is not complete (status {status!r}); {_finish_hint(d)}")
            out.notes.append(f"skipped incomplete run {d} (status {status!r}): {_finish_hint(d)}")
            continue
        if not (d / "records.parquet").is_file():
            if p == d:
                raise UserError(f"{d}: no records.parquet in this run folder; {_finish_hint(d)}")
            out.notes.append(f"skipped {d}: no records.parquet (status {status!r})")
            continue
        verify_run_files(d, info)  # records.parquet and summary.csv are what finalize wrote, or refused
        frames.append(with_run_identity(pd.read_parquet(d / "records.parquet"), info))
        out.runs.append({**info, "path": str(d)})
    if not frames:
        raise UserError(f"no complete runs under {p}" + ("".join(f"\n  {n}" for n in out.notes)))
    _tell_apart(p, frames, out)
    out.records = pd.concat(frames, ignore_index=True)
    return out


def _tell_apart(root: Path, frames: List[pd.DataFrame], out: "LoadedRuns") -> None:
    """A run's id is its folder's name, so two folders named alike (a study's ``standard/pgd-4`` and
    ``converged/pgd-4``) share one: grouped by it, their samples would be counted together (n doubled, the
    interval narrowed). Such runs are told apart by their path under ``root``, with a note."""
    ids = [str(r.get("run_id", "")) for r in out.runs]
    shared = {i for i in ids if ids.count(i) > 1}
    if not shared:
        return
    for k, run in enumerate(out.runs):
        if run["run_id"] in shared:
            new = Path(run["path"]).relative_to(root).as_posix() if root != Path(run["path"]) else run["run_id"]
            frames[k] = frames[k].assign(run_id=new)
            out.runs[k] = {**run, "run_id": new}
    out.notes.append(f"run id(s) {', '.join(sorted(shared))} name several folders under {root}: each run is told "
                     f"apart by its path there")


def load_run_info(run_dir: Union[str, Path]) -> dict:
    """A run's run.json as a dict; one that is not a JSON object (damaged, hand-edited) is one UserError."""
    path = Path(run_dir) / "run.json"
    try:
        info = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        info = None
    if not isinstance(info, dict):
        raise UserError(f"{path} is damaged (not a JSON object of run provenance); re-run the command that made the "
                        f"run with the same --out (finished work units are reused and run.json is written again)")
    return info


def with_run_identity(records: pd.DataFrame, info: dict) -> pd.DataFrame:
    """Records of a run folder written before they carried their identity: the precision comes
    from the run's run.json, then the settings identity is derived as for new records."""
    if "precision" not in records.columns:
        records = records.assign(precision=str(info.get("precision") or "fp32"))
    return add_identity(records)


def load_records(path: Union[str, Path], include_incomplete: bool = False) -> pd.DataFrame:
    """Per-sample records of one run folder or of every complete run under a folder (the policy
    for incomplete runs is :func:`load_runs`'). Runs left out are reported as a warning and in
    ``records.attrs["notes"]``."""
    loaded = load_runs(path, include_incomplete=include_incomplete)
    for note in loaded.notes:
        warnings.warn(note, stacklevel=2)
    records = loaded.records
    records.attrs["notes"] = list(loaded.notes)
    return records


def load_results(path: Union[str, Path], ce_baseline: Optional[str] = None) -> pd.DataFrame:
    """Tidy DataFrame: one row per (run, model, dataset, attack, eps, metric), values in percent."""
    return summarize(load_records(path), ce_baseline=ce_baseline)
