"""The one results-loading path of tables, check, plots and report.

Inputs are run folders (per-sample records: the truth, needed for paired tests), ``records.parquet``
files, tidy DataFrames (``load_results``) or tidy CSV files (``summary.csv``, a baseline). They are
loaded once (run folders through :func:`results.load_records` and :func:`results.summarize`),
labelled and de-duplicated once, and the prepared :class:`Inputs` is handed down to every view.

Attack metadata comes from the rows themselves (``attack_label``, ``norm``, ``white_box``,
``paper_eps``, stamped when the results were summarized); tidy CSVs from before those columns get
the fallbacks (the attack name upper-cased, eps as ``%g``), never a look-up in the attack registry.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd

from ..errors import UserError
from ..core.labels import attack_title, eps_text
from .store import load_runs, summarize
from .files.verify import verify_file

OOD_DATASETS = ("imagenet-a", "imagenet-r", "imagenet-c", "imagenet-o")
ACCURACY_METRICS = ("top1", "top5")
CORRUPTION_METRICS = ("mce", "mean_err")  # mean_err: unnormalized, when no CE baseline exists (non-ImageNet)
AGGREGATE_METRICS = CORRUPTION_METRICS + ("aupr",)
TIDY_REQUIRED = {"model", "attack", "eps", "metric", "value"}
EPS_DECIMALS = 10
# one cell per key: the settings are part of it, so different attacks are never merged into one cell
KEY = ["label", "dataset", "protocol", "benchmark", "attack", "eps_key", "settings_id", "metric", "condition"]


@dataclass
class Inputs:
    """Prepared results: labelled tidy rows (``rows``: all of them; ``results``: one per cell key),
    the per-sample records behind them (when available), each run's run.json and the notes that
    loading and de-duplication left (shown under every table)."""

    results: pd.DataFrame
    rows: pd.DataFrame
    records: Optional[pd.DataFrame] = None
    runs: List[Dict[str, Any]] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


def prepare(tidy: pd.DataFrame, records: Optional[pd.DataFrame] = None,
            runs: Optional[List[Dict[str, Any]]] = None, notes: Sequence[str] = ()) -> Inputs:
    """Label and de-duplicate tidy rows once."""
    rows = with_labels(tidy)
    shown, dup_notes = dedupe(rows)
    return Inputs(shown, rows, records, list(runs or []), list(notes) + dup_notes)


def load_inputs(paths: Union[str, Path, Sequence[Union[str, Path]]], ce_baseline: Optional[str] = None) -> Inputs:
    """Run folders (or folders of runs), ``records.parquet`` files or tidy ``.csv`` files.

    ``ce_baseline``: the model whose corruption errors normalize CE/mCE outside ImageNet."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    tidy: List[pd.DataFrame] = []
    recs: List[pd.DataFrame] = []
    runs: List[Dict[str, Any]] = []
    notes: List[str] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise UserError(f"results path not found: {p}")
        if p.is_file():
            verify_file(p)  # a run's own summary.csv / records.parquet: checked against its run.json
        if p.is_file() and p.suffix == ".csv":
            df = pd.read_csv(p)
            missing = TIDY_REQUIRED - set(df.columns)
            if missing:
                raise UserError(f"{p}: not a tidy results CSV (missing columns {', '.join(sorted(missing))})")
            tidy.append(numeric(df, p, "or give the run folders it came from instead"))
        elif p.is_file() and p.suffix == ".parquet":
            recs.append(pd.read_parquet(p))
        elif p.is_file():
            raise UserError(f"{p}: expected a run folder, a records .parquet or a tidy .csv file")
        else:
            loaded = load_runs(p)  # a named incomplete run is an error; incomplete runs under a folder are noted
            recs.append(loaded.records)
            runs += loaded.runs
            notes += loaded.notes
    records = pd.concat(recs, ignore_index=True) if recs else None
    if records is not None and len(recs) > 1:
        records, dropped = drop_repeated_records(records)
        if dropped:
            notes.append(f"{dropped} per-sample records were given more than once (e.g. a run folder and its "
                         f"records.parquet, or a folder and a run inside it): each counted once")
    if records is not None:
        tidy.insert(0, summarize(records, ce_baseline=ce_baseline))
    if not tidy:
        raise UserError("no results given: pass run folders, records .parquet or tidy .csv files")
    return prepare(pd.concat(tidy, ignore_index=True), records, runs, notes)


NUMERIC = ("value", "n", "ci_low", "ci_high", "eps")


def numeric(df: pd.DataFrame, path: Union[str, Path], fix: str) -> pd.DataFrame:
    """``df`` (a tidy CSV or a baseline read from ``path``) with its number columns as numbers; a cell that is text
    (``abc``, ``41.67%``) is one UserError naming the file, its line and the fix (it failed later as a traceback,
    or an eps read as 0). Empty cells stay NaN."""
    df = df.copy()
    for col in (c for c in NUMERIC if c in df.columns):
        raw = df[col]
        num = pd.to_numeric(raw, errors="coerce")
        bad = num.isna() & raw.notna() & (raw.astype(str).str.strip() != "")
        if bad.any():
            i = bad.idxmax()
            r = df.loc[i]
            what = " ".join(str(r.get(k, "")) for k in ("model", "attack", "metric") if pd.notna(r.get(k, "")))
            raise UserError(f"{path}: line {int(i) + 2} ({what}): {col} {raw[i]!r} is not a number; write a plain "
                            f"number (percent values without '%', e.g. 41.67), {fix}")
        df[col] = num
    return df


RECORD_KEY = ("run_id", "unit", "benchmark", "attack", "eps", "settings_id", "condition", "metric", "layer", "sample_id")
VERDICTS = ("correct_top1", "correct_top5", "pred", "value")


def drop_repeated_records(records: pd.DataFrame) -> Tuple[pd.DataFrame, int]:
    """One copy of each record given several times (inputs that overlap), and how many were dropped: counted
    twice, a sample would double ``n`` and narrow every interval. Two records of one sample and condition that
    disagree come from different computations, and which one counts is not for this function to guess."""
    key = [c for c in RECORD_KEY if c in records.columns]
    dup = records.duplicated(key, keep=False)
    if not dup.any():
        return records, 0
    verdicts = [c for c in VERDICTS if c in records.columns]
    if verdicts:
        rep = records.loc[dup, key + verdicts].astype(str)
        differ = rep.groupby(key, sort=False)[verdicts].nunique().gt(1).any(axis=1)
        if differ.any():
            k = dict(zip(key, differ[differ].index[0] if len(key) > 1 else (differ[differ].index[0],)))
            raise UserError(f"the inputs hold different records of one sample and condition (run {k.get('run_id')}, "
                            f"sample {k.get('sample_id')}, attack {k.get('attack', '?')}): they come from different "
                            f"computations under one run id; pass each run once")
    keep = ~records.duplicated(key, keep="first")
    return records[keep].reset_index(drop=True), int((~keep).sum())


def as_inputs(data: Any, records: Optional[pd.DataFrame] = None, ce_baseline: Optional[str] = None) -> Inputs:
    """Anything a user may hand over: paths, an ``Inputs``, tidy results or per-sample records."""
    if isinstance(data, Inputs):
        return data
    if isinstance(data, (str, Path)) or (isinstance(data, (list, tuple)) and data and
                                         all(isinstance(x, (str, Path)) for x in data)):
        return load_inputs(data, ce_baseline=ce_baseline)
    if isinstance(data, pd.DataFrame):
        if "sample_id" in data.columns:
            return prepare(summarize(data, ce_baseline=ce_baseline), data)
        missing = TIDY_REQUIRED - set(data.columns)
        if missing:
            raise UserError(f"not a tidy results table (missing columns {', '.join(sorted(missing))}); "
                            f"use rbp.load_results(path) or pass a results path")
        run_dir = data.attrs.get("run_dir") if records is None else None
        if run_dir and (Path(run_dir) / "records.parquet").is_file():  # rbp.evaluate(...)'s result
            verify_file(Path(run_dir) / "records.parquet")
            records = pd.read_parquet(Path(run_dir) / "records.parquet")
        return prepare(data.copy(), records)
    raise UserError(f"cannot make a table from {type(data).__name__}: pass a results path, "
                    f"rbp.load_results(...) or rbp.load_records(...)")


def with_labels(results: pd.DataFrame) -> pd.DataFrame:
    """Adds ``label`` (the model name, plus the checkpoint hash when one name has several) and
    ``eps_key``, and fills the columns older tidy results lack (attack metadata included)."""
    df = results.copy()
    for col, default in (("dataset", ""), ("protocol", ""), ("benchmark", ""), ("condition", ""), ("n", np.nan),
                         ("ci_low", np.nan), ("ci_high", np.nan), ("run_id", ""), ("checkpoint_sha256", None),
                         ("settings_id", ""), ("setting", ""), ("samples_id", ""), ("attack_label", ""),
                         ("norm", ""), ("white_box", False), ("paper_eps", np.nan)):
        if col not in df.columns:
            df[col] = default
    for col in ("settings_id", "setting", "samples_id", "norm", "attack_label", "condition"):
        df[col] = df[col].astype("string").fillna("").astype(str)  # tidy CSVs: empty cells read as NaN
    df["attack_label"] = [attack_title(a, lab) for a, lab in zip(df["attack"].astype(str), df["attack_label"])]
    df["paper_eps"] = pd.to_numeric(df["paper_eps"], errors="coerce")
    df["eps"] = pd.to_numeric(df["eps"], errors="coerce").fillna(0.0).astype(float)
    df["eps_key"] = df["eps"].round(EPS_DECIMALS)
    sha = df["checkpoint_sha256"].astype("string").fillna("")
    df["label"] = df["model"].astype(str)
    n_sha = sha.where(sha != "").groupby(df["model"]).transform("nunique")
    multi = (n_sha > 1) & (sha != "")  # one name, several checkpoints: tell them apart
    df.loc[multi, "label"] = df.loc[multi, "model"].astype(str) + "@" + sha[multi].str[:8]
    return df


def dedupe(df: pd.DataFrame) -> Tuple[pd.DataFrame, List[str]]:
    """One row per key: when several runs hold the same condition (same settings), keep the one
    with the most samples (then the last run id), and say which run was shown and why: one note per set of
    conditions, naming each model's run (a results folder with a study of 15 models is one note, not 15)."""
    notes: List[str] = []
    dup = df.duplicated(KEY, keep=False)
    out = (df.assign(_n=df["n"].fillna(-1)).sort_values(["_n", "run_id"], kind="stable")
           .drop_duplicates(KEY, keep="last").drop(columns="_n"))
    if dup.any():
        shown: Dict[Tuple[str, str], List[str]] = {}  # (model, run shown) -> its conditions held by several runs
        kept = out.set_index(KEY)["run_id"]
        for key, g in df[dup].groupby(KEY, sort=False, dropna=False):
            what = f"{key[4]}" + (f" {eps_text(key[5], g['norm'].iloc[0])}" if key[5] else "")
            pick = str(kept.loc[key]) if key in kept.index else ""
            shown.setdefault((str(key[0]), pick), []).append(what)
        by_what: Dict[Tuple[str, ...], List[str]] = {}
        for (label, pick), whats in shown.items():
            by_what.setdefault(tuple(dict.fromkeys(whats)), []).append(f"{label} from {pick}")
        for whats, runs in by_what.items():
            notes.append(f"{', '.join(whats)}: identical settings in several runs; shown from the run with the most "
                         f"samples (then the last run id): {', '.join(dict.fromkeys(runs))}")
    return out, notes


def model_order(df: pd.DataFrame, models: Optional[Sequence[str]] = None) -> List[str]:
    """The model columns: the ones asked for (each must be present), else every label sorted."""
    present = sorted(df["label"].unique())
    if not models:
        return present
    unknown = [m for m in models if m not in present]
    if unknown:
        raise UserError(f"model(s) {', '.join(unknown)} not in the results; present: {', '.join(present)}")
    return list(models)


def norm_of(df: pd.DataFrame, attack: str) -> str:
    """The recorded norm of an attack in labelled rows ('' when the rows do not say)."""
    return attack_norms(df[df["attack"] == attack]).get(attack, "")


def attack_norms(df: pd.DataFrame) -> Dict[str, str]:
    """attack -> its recorded norm, for every attack whose labelled rows say."""
    known = df[df["norm"] != ""]
    return dict(zip(known["attack"].astype(str), known["norm"]))
