"""The baseline file of ``check``: a reviewable CSV of tidy rows, and its per-sample sidecar.

One row per model, dataset, protocol, attack, eps, metric (and condition) with value, n, its 95%
interval, what the number means (the condition's settings and sample set) and where it was made
(device, precision, library versions). ``--update`` also writes the per-sample verdicts beside it
(``NAME.samples.parquet``) so a later check can compare old and new on the samples both have.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Union

import numpy as np
import pandas as pd

from ..conditions import canonical, short_hash
from ...errors import UserError
from ..inputs import EPS_DECIMALS, numeric
from ..files.run_files import atomic_write_bytes, parquet_bytes
from ..files.verify import verify_file

CHECK_KEY = ["model", "dataset", "protocol", "attack", "eps", "metric", "condition"]  # condition: e.g. layer=3
IDENTITY = ["setting", "settings_id", "samples_id", "settings"]
ENVIRONMENT = ["device", "precision", "versions"]
# status: what kind of number a converged value is (--converge: converged / not converged / upper bound); "" otherwise
BASELINE_COLUMNS = CHECK_KEY + ["value", "n", "ci_low", "ci_high", "benchmark", "checkpoint_sha256"] + IDENTITY + \
    ENVIRONMENT + ["status"]
STRING_COLS = ("dataset", "protocol", "condition", "benchmark", "status") + tuple(IDENTITY) + tuple(ENVIRONMENT)


def _match_id(settings: str) -> str:
    """The settings a check matches on: everything but the precision, which ``check`` treats as part
    of the environment (rounding, not another attack; see ``robustbench_pid.results.ci.check``)."""
    if not settings:
        return ""
    if "+" in settings and not settings.startswith("{"):  # a derived row: the identities it combines
        return short_hash(settings)
    try:
        d = json.loads(settings)
    except ValueError:
        return short_hash(settings)
    d.pop("precision", None)
    return short_hash(canonical(d))


def normalize(df: pd.DataFrame) -> pd.DataFrame:
    """Baseline or result rows in one comparable form: string columns without NaN, eps rounded,
    ``_match`` (the settings a check matches on)."""
    df = df.copy()
    for col in STRING_COLS:
        if col not in df.columns:
            df[col] = ""
        df[col] = df[col].astype("string").fillna("").astype(str)
    for col in ("n", "ci_low", "ci_high", "checkpoint_sha256", "run_id"):
        if col not in df.columns:
            df[col] = np.nan
    df["eps"] = pd.to_numeric(df["eps"], errors="coerce").fillna(0.0).round(EPS_DECIMALS)
    df["_match"] = [_match_id(x) for x in df["settings"]]
    return df


def read_baseline(path: Union[str, Path]) -> pd.DataFrame:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"baseline not found: {p}. Create it from good results with `robustbench-pid check "
                        f"RESULTS --baseline {p} --update`")
    verify_file(p)  # a run's summary.csv used as a baseline: checked against its run.json
    try:
        df = pd.read_csv(p)
    except Exception as exc:  # noqa: BLE001
        raise UserError(f"{p}: not a readable CSV ({exc})") from None
    if "condition" not in df.columns:
        df["condition"] = ""
    missing = set(CHECK_KEY + ["value"]) - set(df.columns)
    if missing:
        raise UserError(f"{p}: not a baseline CSV (missing columns {', '.join(sorted(missing))}); "
                        f"write one with --update")
    return normalize(numeric(df, p, "or rewrite the baseline from trusted results with --update"))



def sidecar(path: Union[str, Path]) -> Path:
    """The per-sample verdicts written beside a baseline (for comparisons on shared samples)."""
    p = Path(path)
    return p.with_name(p.stem + ".samples.parquet")


VERDICT_COLUMNS = ["model", "dataset", "attack", "eps", "settings_id", "sample_id", "correct_top1", "correct_top5"]


def read_sidecar(baseline: Union[str, Path]) -> Optional[pd.DataFrame]:
    """The per-sample verdicts beside ``baseline`` (None when there are none); a damaged or foreign file there is
    one UserError (it was a pyarrow traceback, or a KeyError once samples changed)."""
    side = sidecar(baseline)
    if not side.is_file():
        return None
    try:
        v = pd.read_parquet(side)
    except Exception:  # noqa: BLE001 - any unreadable file: the same answer
        v = None
    if v is None or list(v.columns[:len(VERDICT_COLUMNS)]) != VERDICT_COLUMNS:
        raise UserError(f"{side}: not the per-sample sidecar of {baseline} (damaged, or another file); remove it "
                        f"(check then compares without per-sample verdicts) or rewrite both with --update")
    return v


def check_update_target(path: Union[str, Path]) -> None:
    """``check --update`` writes only a baseline and its own sidecar: never into a run folder (its
    summary.csv is the run's, checksummed in its run.json), never over a file that is not a
    baseline, never over a ``NAME.samples.parquet`` that is not the baseline's per-sample sidecar."""
    p = Path(path)
    for d in (p.parent, p.parent.parent):
        if (d / "run.json").is_file() or (d / "plan.json").is_file():
            raise UserError(f"refusing to write the baseline {p} into the run folder {d}: a run's files are "
                            f"written by evaluate/merge only. Write the baseline outside it, e.g. "
                            f"--baseline results/baselines/{d.name}.csv")
    if p.is_dir():
        raise UserError(f"--baseline {p} is a directory; give a .csv file name, e.g. {p / 'baseline.csv'}")
    side = sidecar(p)
    if side.exists():
        try:
            import pyarrow.parquet as pq

            cols = list(pq.read_schema(side).names)
        except Exception:  # noqa: BLE001 - unreadable means it is not ours either
            cols = []
        if cols[:len(VERDICT_COLUMNS)] != VERDICT_COLUMNS:
            raise UserError(f"refusing to overwrite {side}: it is not the per-sample sidecar of a baseline "
                            f"(columns {', '.join(cols[:8]) or 'unreadable'}); move it away or choose another "
                            f"--baseline name")


def write_baseline(rows: pd.DataFrame, path: Union[str, Path], records: Optional[pd.DataFrame] = None) -> Path:
    p = Path(path)
    check_update_target(p)
    p.parent.mkdir(parents=True, exist_ok=True)
    out = rows.sort_values(CHECK_KEY + ["settings_id"], kind="stable")[BASELINE_COLUMNS]
    text = out.to_csv(index=False, float_format="%.12g")
    verdicts = verdicts_of(records)
    # temp file + rename (run_files): a symlink standing at either path is replaced, never written through
    if verdicts is not None:
        atomic_write_bytes(sidecar(p), parquet_bytes(verdicts), durable=False)
    atomic_write_bytes(p, text.encode(), durable=False)
    return p


def verdicts_of(records: Optional[pd.DataFrame]) -> Optional[pd.DataFrame]:
    """Per-sample top-1/top-5 verdicts of each condition (None when the records cannot say)."""
    cols = VERDICT_COLUMNS
    if records is None or not set(cols) <= set(records.columns):
        return None
    v = records[cols].copy()
    v["eps"] = v["eps"].astype(float).round(EPS_DECIMALS)
    v["sample_id"] = v["sample_id"].astype(str)
    return v.drop_duplicates(["model", "dataset", "attack", "eps", "settings_id", "sample_id"])
