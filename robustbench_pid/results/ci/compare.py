"""Row-by-row comparison of results with a baseline: the rules behind ``check``'s statuses (see
``robustbench_pid.results.ci.check`` for what each status means and how CI uses them).

One job: given the current rows and the baseline rows (both normalised), say per key whether the number
held, improved, regressed (beyond the tolerance, and significantly when asked or across devices), went
missing, or no longer measures the same thing (settings, sample set or converge status changed).
"""
from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from .baseline import CHECK_KEY, normalize, verdicts_of
from ..conditions import settings_diff
from ...errors import UserError
from ..report.indicators import INDICATORS
from ..summaries.converge import CONVERGED
from ..stats.metrics import wilson_interval
from ..stats.stats import newcombe_difference_interval

MATCH_KEY = ["model", "dataset", "attack", "eps", "metric", "condition"]  # + the settings (protocol included)
EPS = 1e-6  # absorbs float formatting in the CSV; far below one sample (100/n points)


def lower_is_better(metric: str) -> bool:
    """Errors (mCE, mean and per-corruption error, CE), FPR95, skipped images, token similarity (rank
    collapse) and the indicators of attack failure (a rise in flagged samples is the regression)."""
    return (metric in ("mce", "relative_mce", "mean_err", "fpr95", "skipped_unreadable", "token_cosine", *INDICATORS)
            or metric.startswith(("ce_", "err_")))



def _on_shared(old: Dict[str, Any], new: Dict[str, Any], base_v: Optional[pd.DataFrame],
               cur_v: Optional[pd.DataFrame]) -> Optional[Tuple[float, float, float, float, float, float, int]]:
    """(old, lo, hi, new, lo, hi, n) accuracy on the samples both sets have, when both have verdicts."""
    metric = str(new["metric"])
    if base_v is None or cur_v is None or metric not in ("top1", "top5"):
        return None
    col = f"correct_{metric}"

    def pick(v: pd.DataFrame, r: Dict[str, Any]) -> pd.Series:
        m = ((v["model"] == r["model"]) & (v["dataset"] == r["dataset"]) & (v["attack"] == r["attack"])
             & (v["eps"] == r["eps"]) & (v["settings_id"] == r["settings_id"]))
        return v[m].set_index("sample_id")[col].astype(bool)

    a, b = pick(base_v, old), pick(cur_v, new)
    shared = a.index.intersection(b.index)
    if len(shared) == 0:
        return None
    ka, kb, n = int(a.loc[shared].sum()), int(b.loc[shared].sum()), len(shared)
    (la, ha), (lb, hb) = wilson_interval(ka, n), wilson_interval(kb, n)
    return 100 * ka / n, 100 * la, 100 * ha, 100 * kb / n, 100 * lb, 100 * hb, n


def compare(current: pd.DataFrame, baseline: pd.DataFrame, tolerance: float = 0.0,
            significant: bool = False, base_verdicts: Optional[pd.DataFrame] = None,
            notes: Optional[List[str]] = None) -> pd.DataFrame:
    """Row-by-row comparison; ``status`` is ok, improved, within-noise, REGRESSED, MISSING, new,
    SETTINGS-CHANGED or SAMPLES-CHANGED (``changes`` says what changed)."""
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not (
            math.isfinite(tolerance) and tolerance >= 0):  # NaN compares False with everything: nothing would fail
        raise UserError(f"--tolerance must be a finite number >= 0 percentage points, got {tolerance!r}")
    notes = notes if notes is not None else []
    cur = current if "_match" in current.columns else normalize(current)
    base = baseline if "_match" in baseline.columns else normalize(baseline)
    has_settings = bool((base["settings_id"] != "").any())
    if not has_settings:
        notes.append("the baseline predates recorded settings: attack settings and sample sets were not compared; "
                     "rewrite it with --update to guard them too")
        cur = cur.assign(_match="")
        base = base.assign(_match="")
        key = CHECK_KEY
    else:
        key = MATCH_KEY + ["_match"]
    cur_v = verdicts_of(current.attrs.get("records"))
    m = base.merge(cur, on=key, how="outer", suffixes=("_old", "_new"), indicator=True)
    for col in CHECK_KEY:
        if col not in m.columns:  # protocol when matching on settings
            m[col] = m[f"{col}_new"].where(m["_merge"] != "left_only", m[f"{col}_old"])
    # a baseline row and a result row of the same key with different settings: the attack changed
    pairs: Dict[int, int] = {}
    if has_settings:
        left = m[m["_merge"] == "left_only"]
        right = m[m["_merge"] == "right_only"]
        taken: set = set()
        for i, r in left.iterrows():
            same = right[(right[MATCH_KEY] == r[MATCH_KEY]).all(axis=1) & ~right.index.isin(taken)]
            if len(same):
                j = same.index[0]
                pairs[i] = j
                taken.add(j)
    rows = []
    env_diff: set = set()
    skip = set(pairs.values())
    for i, r in m.iterrows():
        if i in skip:
            continue
        out = {k: r[k] for k in CHECK_KEY}
        out.update(old=r.get("value_old"), new=r.get("value_new"), delta=np.nan, new_ci_low=r.get("ci_low_new"),
                   new_ci_high=r.get("ci_high_new"), delta_ci_low=np.nan, delta_ci_high=np.nan, changes="")
        if i in pairs:
            n = m.loc[pairs[i]]
            out.update(status="SETTINGS-CHANGED", new=n.get("value_new"), protocol=n.get("protocol_new"),
                       new_ci_low=n.get("ci_low_new"), new_ci_high=n.get("ci_high_new"),
                       changes="; ".join(settings_diff(str(r.get("settings_old")), str(n.get("settings_new"))))
                       or f"settings {r.get('settings_id_old')} → {n.get('settings_id_new')}")
            if pd.notna(out["new"]) and pd.notna(out["old"]):
                out["delta"] = float(out["new"]) - float(out["old"])
            rows.append(out)
            continue
        if r["_merge"] == "left_only":
            out["status"] = "MISSING"
            rows.append(out)
            continue
        if r["_merge"] == "right_only":
            out["status"] = "new"
            rows.append(out)
            continue
        old, new = float(r["value_old"]), float(r["value_new"])
        if math.isnan(old) and math.isnan(new) and not (_n_of(r.get("n_old")) or _n_of(r.get("n_new"))):
            # e.g. an indicator of an attack that records no iterates: computable on neither side, nothing moved
            out["status"] = "ok"
            out["changes"] = "not computable in the baseline or the results (n = 0)"
            rows.append(out)
            continue
        if not (math.isfinite(old) and math.isfinite(new)):  # NaN compares False with every limit: it would pass
            out["status"] = "INVALID"
            out["changes"] = f"not a finite number: baseline {old}, results {new}"
            rows.append(out)
            continue
        lo_o, hi_o, lo_n, hi_n = r.get("ci_low_old"), r.get("ci_high_old"), r.get("ci_low_new"), r.get("ci_high_new")
        samples_changed = has_settings and r.get("samples_id_old") and r.get("samples_id_new") and \
            r["samples_id_old"] != r["samples_id_new"]
        if samples_changed:
            n_old, n_new = r.get("n_old"), r.get("n_new")
            what = f"n {_n(n_old)} → {_n(n_new)}" if _n(n_old) != _n(n_new) else f"other sample ids (n {_n(n_new)})"
            shared = _on_shared({**{k: r[k] for k in MATCH_KEY}, "settings_id": r.get("settings_id_old")},
                                {**{k: r[k] for k in MATCH_KEY}, "settings_id": r.get("settings_id_new")},
                                base_verdicts, cur_v)
            if shared is not None:
                old, lo_o, hi_o, new, lo_n, hi_n, n_sh = shared
                what += f"; old and new shown on the {n_sh} samples both have"
                out.update(old=old, new=new, new_ci_low=lo_n, new_ci_high=hi_n)
            out["changes"] = f"sample set changed ({what})"
        delta = new - old
        out["delta"] = delta
        worse = -delta if not lower_is_better(str(r["metric"])) else delta  # > 0 means worse
        intervals = [lo_n, hi_n, lo_o, hi_o]
        have_ci = all(v is not None and pd.notna(v) for v in intervals)
        if have_ci:
            lo, hi = newcombe_difference_interval(new, lo_n, hi_n, old, lo_o, hi_o)
            out["delta_ci_low"], out["delta_ci_high"] = lo, hi
        env_old = (r.get("device_old", ""), r.get("precision_old", ""))
        env_new = (r.get("device_new", ""), r.get("precision_new", ""))
        cross = all(env_old) and all(env_new) and env_old != env_new
        if cross:
            env_diff.add((env_old, env_new))
        st_old, st_new = _status(r.get("status_old")), _status(r.get("status_new"))
        if samples_changed:
            out["status"] = "SAMPLES-CHANGED"
        elif st_old != st_new:  # one side without a status (an older baseline, a CSV without the column) is a change
            out["status"] = "STATUS-CHANGED"
            out["changes"] = f"status: {st_old or '(none recorded)'} → {st_new or '(none recorded)'}"
        elif worse > tolerance + EPS:
            if (significant or cross) and have_ci:
                sig = out["delta_ci_high"] < 0 if not lower_is_better(str(r["metric"])) else out["delta_ci_low"] > 0
                out["status"] = "REGRESSED" if sig else "within-noise"
            else:
                out["status"] = "REGRESSED"
        elif worse < -EPS and _converged_value(r, st_old, st_new):
            out["status"], out["changes"] = _converged_rise(st_old, st_new, has_settings, r)
        elif worse < -EPS:
            out["status"] = "improved"
        else:
            out["status"] = "ok"
        rows.append(out)
    for (d_old, p_old), (d_new, p_new) in sorted(env_diff):
        notes.append(f"the baseline was made on {d_old} ({p_old}) and these results on {d_new} ({p_new}): numbers "
                     f"differ by floating-point rounding across devices and precisions, so for those rows only "
                     f"drops that are also significant fail (Newcombe 95% interval)")
    res = pd.DataFrame(rows)
    if res.empty:
        return pd.DataFrame(columns=CHECK_KEY + ["status", "old", "new", "delta", "changes"])
    order = {"REGRESSED": 0, "SETTINGS-CHANGED": 1, "SAMPLES-CHANGED": 2, "STATUS-CHANGED": 2, "MISSING": 3, "within-noise": 4,
             "improved": 5, "new": 6, "ok": 7}
    res["_o"] = res["status"].map(order)
    return res.sort_values(["_o"] + CHECK_KEY, kind="stable").drop(columns="_o").reset_index(drop=True)


def _n(v: Any) -> str:
    return str(int(v)) if v is not None and pd.notna(v) else "?"


def _n_of(v: Any) -> int:
    return int(v) if v is not None and pd.notna(v) else 0


def _status(v: Any) -> str:
    return "" if v is None or pd.isna(v) else str(v)


def _converged_value(r: pd.Series, st_old: str, st_new: str) -> bool:
    """A ``--converge`` value (the ladder's worst case): its benchmark or attack is ``converge``, or it has a status."""
    names = {str(r.get("attack", "")), str(r.get("benchmark_old", "")), str(r.get("benchmark_new", ""))}
    return "converge" in names or bool(st_old or st_new)


def _ladder(settings: Any) -> Optional[Dict[str, Any]]:
    """The ladder's settings recorded in a converged value's settings JSON (``params.ladder``), or None."""
    try:
        lad = json.loads(str(settings)).get("params", {}).get("ladder")
    except (ValueError, AttributeError):
        return None
    return lad if isinstance(lad, dict) and lad else None


def _converged_rise(st_old: str, st_new: str, has_settings: bool, r: pd.Series) -> Tuple[str, str]:
    """(status, why) of a converged value that rose: an improvement only between two fully converged values of
    the same recorded ladder. Anything else (a reduced ladder, one that did not converge, an upper bound, settings
    the baseline never recorded) would let a weaker evaluation pass for a more robust model."""
    if not (st_old == st_new == CONVERGED):
        seen = f"{st_old or '(none recorded)'}" + (f" → {st_new or '(none recorded)'}" if st_new != st_old else
                                                   " on both sides")
        return "STATUS-CHANGED", (f"status: {seen}; a converged value rising counts as improved only when both sides "
                                  f"are exactly '{CONVERGED}' (a reduced, unfinished or bounded ladder finds less): "
                                  f"rerun the full --converge ladder, or accept the number with --update")
    if not has_settings or _ladder(r.get("settings_old")) is None or _ladder(r.get("settings_new")) is None:
        side = "the baseline" if not has_settings or _ladder(r.get("settings_old")) is None else "the results"
        return "SETTINGS-CHANGED", (f"{side} records no ladder settings for this converged value, so a weaker ladder "
                                    f"could pass for an improvement: rewrite the baseline with --update from a "
                                    f"trusted full --converge run")
    return "improved", ""
