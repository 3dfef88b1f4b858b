"""Indicators of attack failure (Pintor et al., NeurIPS 2022), per sample, from records and loss traces.

Pure functions (numpy/pandas): the torch side (``benchmarks/evidence.py``) measures, these decide.
Each indicator flags an attacked sample whose result should not be trusted; a condition reports
the share of its attacked samples flagged (``results/report/evidence_rows.py``). Definitions and
thresholds, with which parts are the paper's and which are ours: docs/attacks.md.

Per-sample record columns read here (written by the adversarial benchmark):
``ever_adversarial`` (some iterate was misclassified at top-1), ``pred``/``label`` (the returned
point), ``grad_zero_steps``/``iterations``, ``loss_trend`` and ``loss_variation`` (with
``--indicators``), and the ``unconstrained`` condition's verdicts (``--indicators``).
A value that cannot be computed is NaN, never 0; :func:`why_missing` says why.
"""
from __future__ import annotations

import json
import math
from typing import Dict, Optional

import numpy as np
import pandas as pd

INDICATORS = ("silent_success", "incomplete_optimization", "unconstrained_failure", "unavailable_gradients",
              "unstable_predictions", "transfer_failure")
UNCONSTRAINED = "unconstrained"  # the ``condition`` of the unbounded run --indicators adds
UNCONSTRAINED_EPS = {"linf": 1.0, "l2": 1000.0, "l1": 100000.0}  # pixel units: the whole [0, 1] box and beyond
LIBRARY_ATTACKS = ("square", "autoattack", "apgd_ce", "apgd_t", "apgd_ranked", "fab_t", "apgd_eot", "apgd_strong")  # their loops are the library's: no iterates

GRAD_ZERO_SHARE = 0.5  # unavailable gradients: zero/non-finite input gradient at more than half the iterates
TREND_WINDOW = 0.1  # incomplete optimisation: the last 10% of the iterates (at least one) ...
TREND_TAU = 0.05  # ... improved the [0, 1]-scaled loss by more than 5% of its range over the window before
UNSTABLE_DRAWS = 8  # unstable predictions: loss at x repeated once and at 8 points x + U(-r, r) ...
UNSTABLE_RADIUS = 1e-3  # ... r in pixel units (~1/4 of 1/255) ...
UNSTABLE_GAMMA = 0.1  # ... flags a relative loss change above 10% ...
LOSS_FLOOR = 0.1  # ... relative to max(|loss at x|, 0.1) (a confident sample's tiny loss is not a scale)
AGREEMENT_WARN = 0.98  # precision agreement: warn when fewer than 98% of the checked verdicts agree


def loss_trend(trace: np.ndarray, window: float = TREND_WINDOW) -> np.ndarray:
    """Per row of ``trace`` (samples x iterates, higher = more adversarial, NaN = not evaluated):
    how much the loss, scaled to [0, 1] over the row, still rose from the window of iterates before
    the last ``window`` share to that last window (mean over each). NaN with fewer than 2 iterates."""
    trace = np.atleast_2d(np.asarray(trace, dtype=np.float64))
    out = np.full(len(trace), np.nan)
    for i, row in enumerate(trace):
        v = row[np.isfinite(row)]
        if len(v) < 2:
            continue
        k = max(1, int(math.ceil(window * len(v))))
        k = min(k, len(v) // 2)
        lo, hi = v.min(), v.max()
        s = (v - lo) / (hi - lo) if hi > lo else np.zeros_like(v)
        out[i] = float(s[-k:].mean() - s[-2 * k:-k].mean())
    return out


def loss_variation(at_x: np.ndarray, around: np.ndarray, floor: float = LOSS_FLOOR) -> np.ndarray:
    """Per sample: max_k |L_k - L(x)| / max(|L(x)|, floor) over the loss at repeats/noisy copies of x."""
    at_x = np.asarray(at_x, dtype=np.float64)
    around = np.atleast_2d(np.asarray(around, dtype=np.float64))
    return np.abs(around - at_x[:, None]).max(1) / np.maximum(np.abs(at_x), floor)


def family(attack: str, params: str) -> str:
    """An attack's settings without eps and random start: what an unconstrained run shares with it."""
    try:
        p = json.loads(params) if params else {}
    except (TypeError, ValueError):
        p = {}
    return attack + json.dumps({k: v for k, v in p.items() if k not in ("eps", "random_start")}, sort_keys=True)


def _col(r: pd.DataFrame, name: str) -> pd.Series:
    return pd.to_numeric(r[name], errors="coerce") if name in r.columns else pd.Series(np.nan, index=r.index)


def _flag(cond: pd.Series, known: pd.Series) -> pd.Series:
    return cond.astype(float).where(known, np.nan)


def sample_flags(records: pd.DataFrame) -> pd.DataFrame:
    """One column per indicator (1.0 flagged, 0.0 not, NaN not computable) for every record.

    Only attacked samples of worst-case attack conditions are judged; the rest are NaN."""
    r = records
    attacked = r["attacked"].astype(bool) if "attacked" in r.columns else pd.Series(True, index=r.index)
    judged = attacked & (r["attack"].astype(str) != "clean")
    if "worst_case" in r.columns:
        judged &= r["worst_case"].fillna(True).astype(bool)
    returned_adv = r["pred"] != r["label"] if {"pred", "label"} <= set(r.columns) else pd.Series(False, index=r.index)
    out = pd.DataFrame(index=r.index)
    ever = _col(r, "ever_adversarial")
    out["silent_success"] = _flag((ever > 0) & ~returned_adv, judged & ever.notna())
    trend = _col(r, "loss_trend")
    out["incomplete_optimization"] = _flag(~returned_adv & (trend > TREND_TAU), judged & trend.notna())
    zero, its = _col(r, "grad_zero_steps"), _col(r, "iterations")
    out["unavailable_gradients"] = _flag(zero > GRAD_ZERO_SHARE * its, judged & zero.notna() & (its > 0))
    var = _col(r, "loss_variation")
    out["unstable_predictions"] = _flag(var > UNSTABLE_GAMMA, judged & var.notna())
    out["unconstrained_failure"] = _unconstrained(r, judged)
    out["transfer_failure"] = np.nan  # no attack here uses a surrogate model
    return out


def _unconstrained(r: pd.DataFrame, judged: pd.Series) -> pd.Series:
    """1.0 where the unconstrained run of the same attack family (same run) still left the sample
    correct at top-1, 0.0 where it broke it, NaN where there is no such run."""
    out = pd.Series(np.nan, index=r.index)
    if "condition" not in r.columns or "params" not in r.columns:
        return out
    fam = [family(a, p) for a, p in zip(r["attack"].astype(str), r["params"].astype(str))]
    run = r["run_id"].astype(str) if "run_id" in r.columns else pd.Series("", index=r.index)
    key = pd.Series([f"{a}|{b}|{s}" for a, b, s in zip(run, fam, r["sample_id"].astype(str))], index=r.index)
    unc = r["condition"].astype(str) == UNCONSTRAINED
    if not unc.any():
        return out
    ok = r["attacked"].astype(bool) if "attacked" in r.columns else pd.Series(True, index=r.index)
    verdict = pd.Series(r.loc[unc & ok, "correct_top1"].astype(float).values, index=key[unc & ok].values)
    verdict = verdict[~verdict.index.duplicated()]
    got = key.map(verdict)
    return got.where(judged & got.notna(), np.nan)


def why_missing(indicator: str, g: pd.DataFrame, indicators_run: bool) -> str:
    """Why ``indicator`` has no value for condition ``g`` (records of one condition)."""
    attack = str(g["attack"].iloc[0]) if len(g) else ""
    if indicator == "transfer_failure":
        return "not applicable: no surrogate model (every attack here queries the evaluated model itself)"
    if "worst_case" in g.columns and not g["worst_case"].fillna(True).astype(bool).all():
        return "not applicable: not a worst-case attack (random noise does not search)"
    if "attacked" in g.columns and not g["attacked"].astype(bool).any():
        return "not computable: no sample was attacked"
    if attack in LIBRARY_ATTACKS and indicator != "unconstrained_failure":
        return f"not computable: {attack} runs the library's own loop, whose iterates and gradients are not visible"
    if indicator == "unavailable_gradients":
        return "not applicable: gradient-free attack"
    if indicator in ("unstable_predictions", "unconstrained_failure") and not indicators_run:
        return "not computed: run with --indicators"
    if indicator == "incomplete_optimization":
        return "not computable: the attack has no loss trace (one step, or no loss evaluated per iterate)"
    if indicator == "unstable_predictions" and "protocol" in g.columns and (g["protocol"] == "paper").any():
        return "not computed in the paper protocol (its attacks see normalised tensors)"
    if indicator == "silent_success":
        return "not computable: the attack's iterates were not observed"
    if indicator == "unconstrained_failure":
        return "not computable: no unconstrained run of this attack"
    return "not computable for this condition"


def flag_shares(flags: pd.DataFrame) -> Dict[str, Optional[float]]:
    """Share flagged per indicator over the samples where it is known (None: known nowhere)."""
    return {k: (float(flags[k].mean()) if flags[k].notna().any() else None) for k in INDICATORS if k in flags}
