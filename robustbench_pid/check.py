"""Regression checks for CI: compare results with a committed baseline CSV.

A baseline is a plain CSV (one row per model, dataset, protocol, attack, eps, metric with value,
n and its 95% interval), reviewable in a pull request. ``check`` fails when a number gets worse by
more than the tolerance (in percentage points; "worse" is lower for accuracies and AUPR, higher for
mCE/CE/FPR) or when a baseline row is missing from the results. New rows are listed, never a failure.

``significant=True`` (CI-aware mode) also requires the drop to be statistically significant: the
95% interval of new - old (Newcombe's method from the two Wilson intervals) must lie entirely on
the worse side of zero. Rows without intervals (e.g. mCE without a bootstrap interval) fall back to
the tolerance alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional, Sequence, Union

import numpy as np
import pandas as pd

from .errors import UserError
from .stats import newcombe_difference_interval
from .tables import EPS_DECIMALS, as_inputs, eps_text

CHECK_KEY = ["model", "dataset", "protocol", "attack", "eps", "metric", "condition"]  # condition: e.g. layer=3
EPS = 1e-6  # absorbs float formatting in the CSV; far below one sample (100/n points)
BASELINE_COLUMNS = CHECK_KEY + ["value", "n", "ci_low", "ci_high", "benchmark", "checkpoint_sha256"]


def lower_is_better(metric: str) -> bool:
    return metric in ("mce", "relative_mce", "fpr95", "mean_error") or metric.startswith("ce_")


@dataclass
class CheckResult:
    rows: pd.DataFrame  # one row per compared key with a status
    tolerance: float
    significant: bool
    baseline: str = ""
    notes: List[str] = field(default_factory=list)

    @property
    def failures(self) -> pd.DataFrame:
        return self.rows[self.rows["status"].isin(["REGRESSED", "MISSING"])]

    @property
    def ok(self) -> bool:
        return self.failures.empty

    def report(self, verbose: bool = False) -> str:
        """Readable diff: the failing rows (all rows with ``verbose``) and a one-line summary."""
        r = self.rows
        counts = r["status"].value_counts()
        show = r if verbose else r[r["status"] != "ok"]
        lines: List[str] = []
        if len(show):
            t = show.assign(
                eps=[eps_text(e, a) for e, a in zip(show["eps"], show["attack"])],
                old=[_f(v) for v in show["old"]], new=[_f(v) for v in show["new"]],
                delta=[_f(v, signed=True) for v in show["delta"]],
                interval=[f"[{_f(lo)}, {_f(hi)}]" if pd.notna(lo) else "" for lo, hi in
                          zip(show["new_ci_low"], show["new_ci_high"])],
                **{"delta 95% CI": [f"[{_f(lo, True)}, {_f(hi, True)}]" if pd.notna(lo) else "" for lo, hi in
                                    zip(show["delta_ci_low"], show["delta_ci_high"])]},
            )[["status", "model", "dataset", "protocol", "attack", "eps", "metric", "old", "new", "delta",
               "interval", "delta 95% CI"]]
            lines.append(t.to_string(index=False))
            lines.append("")
        mode = "significant drops only (Newcombe 95% interval of new-old)" if self.significant else "any drop"
        lines.append(
            f"check against {self.baseline or 'baseline'}: {len(r)} rows; "
            f"{counts.get('ok', 0)} ok, {counts.get('REGRESSED', 0)} regressed, {counts.get('MISSING', 0)} missing, "
            f"{counts.get('improved', 0)} improved, {counts.get('within-noise', 0)} drops not significant, "
            f"{counts.get('new', 0)} new; tolerance {self.tolerance:g} pp, failing on {mode}")
        lines += [f"note: {n}" for n in self.notes]
        lines.append("FAILED" if not self.ok else "PASSED")
        return "\n".join(lines)


def _f(v: Any, signed: bool = False) -> str:
    if v is None or pd.isna(v):
        return "-"
    return f"{v:+.2f}" if signed else f"{v:.2f}"


def current_rows(data: Any, metrics: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """Tidy results reduced to one row per check key (ambiguity is an error, not a guess)."""
    inp = as_inputs(data)
    df = inp.results.copy()
    for col in ("dataset", "protocol", "benchmark", "condition"):
        if col not in df.columns:
            df[col] = ""
        df[col] = df[col].astype("string").fillna("").astype(str)
    for col in ("n", "ci_low", "ci_high", "checkpoint_sha256", "run_id"):
        if col not in df.columns:
            df[col] = np.nan
    df["eps"] = pd.to_numeric(df["eps"], errors="coerce").fillna(0.0).round(EPS_DECIMALS)
    if metrics:
        df = df[df["metric"].isin(metrics)]
    dup = df.duplicated(CHECK_KEY, keep=False)
    if dup.any():
        d = df[dup].iloc[0]
        runs = sorted(set(df[dup & (df[CHECK_KEY] == d[CHECK_KEY]).all(axis=1)]["run_id"].astype(str)))
        raise UserError(f"the results hold {int(dup.sum())} rows sharing a key, e.g. {d['model']} {d['dataset']} "
                        f"{d['protocol']} {d['attack']} eps={eps_text(d['eps'], d['attack'])} {d['metric']} "
                        f"(runs {', '.join(runs)}); point check at one run folder per model/setting")
    return df[BASELINE_COLUMNS].reset_index(drop=True)


def read_baseline(path: Union[str, Path]) -> pd.DataFrame:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"baseline not found: {p}. Create it from good results with `robustbench-pid check "
                        f"RESULTS --baseline {p} --update`")
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
    df["eps"] = pd.to_numeric(df["eps"], errors="coerce").fillna(0.0).round(EPS_DECIMALS)
    for col in ("dataset", "protocol", "condition"):
        df[col] = df[col].astype("string").fillna("").astype(str)
    for col in ("n", "ci_low", "ci_high"):
        if col not in df.columns:
            df[col] = np.nan
    return df


def write_baseline(rows: pd.DataFrame, path: Union[str, Path]) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    out = rows.sort_values(CHECK_KEY, kind="stable")[BASELINE_COLUMNS]
    tmp = p.with_name(f".{p.name}.tmp")
    out.to_csv(tmp, index=False, float_format="%.12g")
    tmp.replace(p)
    return p


def compare(current: pd.DataFrame, baseline: pd.DataFrame, tolerance: float = 0.0,
            significant: bool = False) -> pd.DataFrame:
    """Row-by-row comparison; ``status`` is ok, improved, within-noise, REGRESSED, MISSING or new."""
    if tolerance < 0:
        raise UserError(f"--tolerance must be >= 0 percentage points, got {tolerance}")
    cur = current.copy()
    base = baseline.copy()
    for df in (cur, base):
        for col in ("dataset", "protocol", "condition"):
            df[col] = df[col].astype("string").fillna("").astype(str)
    m = base.merge(cur, on=CHECK_KEY, how="outer", suffixes=("_old", "_new"), indicator=True)
    rows = []
    for _, r in m.iterrows():
        old, new = r.get("value_old"), r.get("value_new")
        out = {k: r[k] for k in CHECK_KEY}
        out.update(old=old, new=new, delta=np.nan, new_ci_low=r.get("ci_low_new"), new_ci_high=r.get("ci_high_new"),
                   delta_ci_low=np.nan, delta_ci_high=np.nan)
        if r["_merge"] == "left_only":
            out["status"] = "MISSING"
        elif r["_merge"] == "right_only":
            out["status"] = "new"
        else:
            delta = float(new) - float(old)
            out["delta"] = delta
            worse = -delta if not lower_is_better(str(r["metric"])) else delta  # > 0 means worse
            intervals = [r.get(c) for c in ("ci_low_new", "ci_high_new", "ci_low_old", "ci_high_old")]
            have_ci = all(v is not None and pd.notna(v) for v in intervals)
            if have_ci:
                lo, hi = newcombe_difference_interval(float(new), intervals[0], intervals[1],
                                                      float(old), intervals[2], intervals[3])
                out["delta_ci_low"], out["delta_ci_high"] = lo, hi
            if worse > tolerance + EPS:
                if significant and have_ci:
                    sig = out["delta_ci_high"] < 0 if not lower_is_better(str(r["metric"])) else out["delta_ci_low"] > 0
                    out["status"] = "REGRESSED" if sig else "within-noise"
                else:
                    out["status"] = "REGRESSED"
            elif worse < -EPS:
                out["status"] = "improved"
            else:
                out["status"] = "ok"
        rows.append(out)
    res = pd.DataFrame(rows)
    order = {"REGRESSED": 0, "MISSING": 1, "within-noise": 2, "improved": 3, "new": 4, "ok": 5}
    res["_o"] = res["status"].map(order)
    return res.sort_values(["_o"] + CHECK_KEY, kind="stable").drop(columns="_o").reset_index(drop=True)


def check(results: Any, baseline: Union[str, Path], tolerance: float = 0.0,
          metrics: Optional[Sequence[str]] = None, significant: bool = False) -> CheckResult:
    """Compare ``results`` (paths, tidy DataFrame) with the baseline CSV; see the module docstring."""
    cur = current_rows(results, metrics)
    base = read_baseline(baseline)
    notes: List[str] = []
    if metrics:
        unknown = set(metrics) - set(base["metric"]) - set(cur["metric"])
        if unknown:
            raise UserError(f"--metric {', '.join(sorted(unknown))}: not in the baseline or the results; present: "
                            f"{', '.join(sorted(set(base['metric']) | set(cur['metric'])))}")
        base = base[base["metric"].isin(metrics)]
    if cur.empty:
        raise UserError("the results hold no rows to check" + (" for the chosen --metric" if metrics else ""))
    sha_old = base.dropna(subset=["checkpoint_sha256"]).groupby("model")["checkpoint_sha256"].first() \
        if "checkpoint_sha256" in base.columns else pd.Series(dtype=str)
    sha_new = cur.dropna(subset=["checkpoint_sha256"]).groupby("model")["checkpoint_sha256"].first()
    for model in sorted(set(sha_old.index) & set(sha_new.index)):
        if sha_old[model] != sha_new[model]:
            notes.append(f"{model}: checkpoint changed ({str(sha_old[model])[:12]} -> {str(sha_new[model])[:12]})")
    absent = sorted(set(base["model"].astype(str)) - set(cur["model"].astype(str)))
    if absent:
        notes.append(f"model(s) {', '.join(absent)} of the baseline are not in the results at all: evaluate them "
                     f"too, or check against a baseline of the models you ran")
    rows = compare(cur, base, tolerance=tolerance, significant=significant)
    return CheckResult(rows, tolerance, significant, str(baseline), notes)


def update(results: Any, baseline: Union[str, Path], metrics: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """Rewrite the baseline from the results (deliberately); returns what changed against the old one."""
    cur = current_rows(results, metrics)
    if cur.empty:
        raise UserError("the results hold no rows to write" + (" for the chosen --metric" if metrics else ""))
    p = Path(baseline)
    old = read_baseline(p) if p.is_file() else None
    changes = compare(cur, old if not metrics else old[old["metric"].isin(metrics)]) if old is not None \
        else cur.assign(status="new")
    if old is not None and metrics:  # only the chosen metrics are rewritten; the others stay as they were
        keep = old[~old["metric"].isin(metrics)]
        cur = pd.concat([keep.reindex(columns=BASELINE_COLUMNS), cur], ignore_index=True)
    write_baseline(cur, p)
    return changes
