"""Paired model comparisons on the same samples: delta and p-value per cell, bootstrap intervals.

Accuracies: McNemar's exact test on the per-sample verdicts. mCE / mean corruption error and
AUPR: a paired bootstrap over samples (stratified by the OOD label for AUPR). Only cells of one
condition are paired (equal ``settings_id``); without per-sample records a delta is shown only
when both values come from the same sample set, and no p-value.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from ...core.imagenet_info import CORRUPTIONS_15
from ..inputs import ACCURACY_METRICS, AGGREGATE_METRICS, CORRUPTION_METRICS, EPS_DECIMALS, as_inputs, model_order
from ..stats.metrics import mean_corruption_error
from ..summaries.adversarial import worst_case_records
from ..summaries.corruptions import ALEXNET_DATASETS
from ..stats.stats import average_precision, bootstrap_interval, mcnemar_exact, paired_bootstrap

OOD_LABEL_COLUMNS = ("is_ood", "ood", "out_of_distribution", "positive")
CORRUPTION_CONDITION = re.compile(r"^(?P<corruption>[a-z_]+)/(?P<severity>[1-9])$")


def _records_for(records: pd.DataFrame, row: Mapping[str, Any]) -> pd.DataFrame:
    """The per-sample records behind one tidy row (its run, dataset, protocol, attack, eps)."""
    m = records["run_id"] == row["run_id"]
    aggregate = row.get("metric") in AGGREGATE_METRICS  # computed over many conditions/attack labels of a run
    for col in ("model", "dataset", "protocol", "benchmark") + (() if aggregate else ("attack",)):
        if col in records.columns and col in row and row[col] != "":
            m &= records[col] == row[col]
    if "eps" in records.columns and not aggregate:
        m &= records["eps"].astype(float).round(EPS_DECIMALS) == row["eps_key"]
    if "settings_id" in records.columns and row.get("settings_id") and not aggregate:
        m &= records["settings_id"] == row["settings_id"]
    out = records[m]
    if out.empty and row.get("attack") == "worst-case":  # derived at summary time: derive it per sample too
        wc = worst_case_records(records[records["run_id"] == row["run_id"]])
        if wc.empty:
            return wc
        wc = wc[wc["eps"].astype(float).round(EPS_DECIMALS) == row["eps_key"]]
        return wc[wc["settings_id"] == row["settings_id"]] if row.get("settings_id") else wc
    return out


def _paired(ra: pd.DataFrame, rb: pd.DataFrame, cols: Sequence[str]) -> pd.DataFrame:
    a = ra[["sample_id", *cols]].drop_duplicates("sample_id")
    b = rb[["sample_id", *cols]].drop_duplicates("sample_id")
    return a.merge(b, on="sample_id", suffixes=("_a", "_b"))


def corruption_error_matrix(recs: pd.DataFrame) -> Optional[Tuple[pd.Index, List[str], np.ndarray]]:
    """(sample ids, 'corruption/severity' conditions, 0/1 top-1 error matrix) or None.

    Only the 15 corruptions that enter mCE when any of them is present (the 4 held-out ones are not
    part of mCE or of the mean error)."""
    if "condition" not in recs.columns or "correct_top1" not in recs.columns:
        return None
    r = recs[recs["condition"].astype(str).str.match(CORRUPTION_CONDITION)]
    c15 = set(CORRUPTIONS_15)
    names = r["condition"].astype(str).str.rsplit("/", n=1).str[0]
    if names.isin(c15).any():
        r = r[names.isin(c15)]
    if r.empty:
        return None
    sid, cond = r["sample_id"].astype(str), r["condition"].astype(str)
    prefixed = [s.startswith(c + "/") for s, c in zip(sid, cond)]
    if prefixed and all(prefixed):  # ImageNet-C ids carry their condition ("fog/3/<wnid>/<file>"): pair by image
        sid = pd.Series([s[len(c) + 1:] for s, c in zip(sid, cond)], index=r.index)
    mat = r.assign(_image=sid).pivot_table(index="_image", columns="condition", values="correct_top1",
                                           aggfunc="first")
    mat = mat.dropna()
    if mat.empty:
        return None
    return mat.index, list(mat.columns), 1.0 - mat.to_numpy(dtype=float)


def mce_statistic(conditions: Sequence[str], dataset: str, metric: str = "mce"):
    """A function of the (samples x conditions) error matrix giving mCE (AlexNet-normalized on
    ImageNet), or the unnormalized mean corruption error x 100 for ``mean_err``, and its name; (None, why)
    for an mCE outside ImageNet, normalized by another model's errors (``--ce-baseline``) that the matrix
    does not hold: a statistic of the matrix alone would measure something else than the cell."""
    corr = [CORRUPTION_CONDITION.match(c).group("corruption") for c in conditions]
    if metric == "mce" and dataset not in ALEXNET_DATASETS:
        return None, "mCE normalized by the --ce-baseline model's errors: no per-sample interval or paired test"
    if metric == "mce":
        def stat(err: np.ndarray) -> float:
            rates = err.mean(0)
            by: Dict[str, List[float]] = {}
            for c, v in zip(corr, rates):
                by.setdefault(c, []).append(float(v))
            return float(mean_corruption_error(by))
        return stat, "mCE (AlexNet-normalized)"

    def mean_err(err: np.ndarray) -> float:
        return 100.0 * float(err.mean())
    return mean_err, "unnormalized mean corruption error"


def ood_arrays(recs: pd.DataFrame) -> Optional[Tuple[pd.DataFrame, str]]:
    """Per-sample anomaly scores and OOD labels, when the records hold them."""
    if "score" not in recs.columns:
        return None
    for col in OOD_LABEL_COLUMNS:
        if col in recs.columns:
            return recs[["sample_id", "score", col]].dropna(), col
    return None


def _aupr(score: np.ndarray, label: np.ndarray) -> float:
    return average_precision(score, label)


@dataclass
class Comparison:
    delta: Optional[float]
    pvalue: Optional[float]
    test: str
    n: int = 0
    note: str = ""
    p_floor: float = 0.0  # bootstrap resolution (1 / resamples)


def compare_rows(ra: Mapping[str, Any], rb: Mapping[str, Any], records: Optional[pd.DataFrame],
                 n_boot: int = 1000, seed: int = 0) -> Comparison:
    """Delta (B - A) and a paired p-value for one metric of two models, on the samples both have.

    Only cells of one condition are compared (callers pass rows with equal ``settings_id``); with
    per-sample records Δ is recomputed on the shared samples, without them it is the difference
    of the two values only when both were computed on the same sample set."""
    delta: Optional[float] = float(rb["value"]) - float(ra["value"])
    metric = ra["metric"]
    same_samples = bool(ra.get("samples_id")) and ra.get("samples_id") == rb.get("samples_id")
    unknown_samples = not ra.get("samples_id") or not rb.get("samples_id")
    if records is None or _records_for(records, ra).empty or _records_for(records, rb).empty:
        if not (same_samples or unknown_samples):
            return Comparison(None, None, "", note="different sample sets and no per-sample records to pair them")
        why = "no per-sample records (pass run folders, not tidy tables)" if records is None else \
            "no per-sample records in the inputs"
        return Comparison(delta, None, "", note=why)
    rec_a, rec_b = _records_for(records, ra), _records_for(records, rb)
    if metric in ACCURACY_METRICS:
        col = f"correct_{metric}"
        if col not in rec_a.columns:
            return Comparison(delta, None, "", note=f"records have no {col}")
        pr = _paired(rec_a, rec_b, [col]).dropna()
        if pr.empty:
            return Comparison(delta, None, "", note="the two runs share no samples")
        res = mcnemar_exact(pr[f"{col}_a"].astype(bool), pr[f"{col}_b"].astype(bool))
        delta = 100.0 * (float(pr[f"{col}_b"].astype(bool).mean()) - float(pr[f"{col}_a"].astype(bool).mean()))
        return Comparison(delta, res.pvalue, "McNemar exact", len(pr))
    if metric in CORRUPTION_METRICS:
        ea, eb = corruption_error_matrix(rec_a), corruption_error_matrix(rec_b)
        if ea is None or eb is None:
            return Comparison(delta, None, "", note="mCE: no per-sample corruption records (condition "
                                                    "'corruption/severity', correct_top1)")
        ids = ea[0].intersection(eb[0])
        conds = [c for c in ea[1] if c in eb[1]]
        if len(ids) == 0 or not conds:
            return Comparison(delta, None, "", note="mCE: the two runs share no samples/conditions")
        A = pd.DataFrame(ea[2], index=ea[0], columns=ea[1]).loc[ids, conds].to_numpy()
        B = pd.DataFrame(eb[2], index=eb[0], columns=eb[1]).loc[ids, conds].to_numpy()
        stat, name = mce_statistic(conds, str(ra["dataset"]), metric)
        if stat is None:
            same = bool(ra.get("samples_id")) and ra.get("samples_id") == rb.get("samples_id")
            return Comparison(delta if same else None, None, "", note=name)
        res = paired_bootstrap(stat, A, B, n_boot=n_boot, seed=seed)
        delta = float(stat(B)) - float(stat(A))
        return Comparison(delta, res.pvalue, f"paired bootstrap ({name})", len(ids), p_floor=1.0 / n_boot)
    if metric == "aupr":
        oa, ob = ood_arrays(rec_a), ood_arrays(rec_b)
        if oa is None or ob is None:
            return Comparison(delta, None, "", note="AUPR: records have no per-sample anomaly score and OOD "
                                                    f"label (columns 'score' and one of {', '.join(OOD_LABEL_COLUMNS)})")
        pr = oa[0].rename(columns={oa[1]: "ood"}).drop_duplicates("sample_id").merge(
            ob[0].rename(columns={ob[1]: "ood"}).drop_duplicates("sample_id"), on="sample_id", suffixes=("_a", "_b"))
        if pr.empty:
            return Comparison(delta, None, "", note="AUPR: the two runs share no samples")
        lab = pr["ood_a"].to_numpy().astype(bool)
        delta = _aupr(pr["score_b"].to_numpy(), lab) - _aupr(pr["score_a"].to_numpy(), lab)  # both in percent
        res = paired_bootstrap(_aupr, (pr["score_a"].to_numpy(), lab), (pr["score_b"].to_numpy(), lab),
                               n_boot=n_boot, seed=seed, strata=lab)
        return Comparison(delta, res.pvalue, "paired bootstrap (AUPR)", len(pr), p_floor=1.0 / n_boot)
    return Comparison(delta, None, "", note=f"no paired test for metric {metric!r}")


def interval_from_records(row: Mapping[str, Any], records: Optional[pd.DataFrame],
                          n_boot: int = 1000, seed: int = 0) -> Tuple[float, float]:
    """Bootstrap interval for an mCE or AUPR row when its records allow one."""
    nan = (float("nan"), float("nan"))
    if records is None:
        return nan
    recs = _records_for(records, row)
    if recs.empty:
        return nan
    if row["metric"] in CORRUPTION_METRICS:
        e = corruption_error_matrix(recs)
        if e is None:
            return nan
        stat, _ = mce_statistic(e[1], str(row["dataset"]), row["metric"])
        if stat is None:
            return nan
        _, lo, hi = bootstrap_interval(stat, e[2], n_boot=n_boot, seed=seed)
        return lo, hi
    if row["metric"] == "aupr":
        o = ood_arrays(recs)
        if o is None:
            return nan
        lab = o[0][o[1]].to_numpy().astype(bool)
        _, lo, hi = bootstrap_interval(_aupr, (o[0]["score"].to_numpy(), lab), n_boot=n_boot, seed=seed, strata=lab)
        return lo, hi
    return nan


def compare_models(data: Any, models: Optional[Sequence[str]] = None, records: Optional[pd.DataFrame] = None,
                   n_boot: int = 1000, seed: int = 0, ce_baseline: Optional[str] = None) -> pd.DataFrame:
    """Every metric both models of each pair have, with delta (B - A) and a paired p-value."""
    inp = as_inputs(data, records, ce_baseline)
    df = inp.results
    order = model_order(df, models)
    rows = []
    cond = ["dataset", "protocol", "benchmark", "attack", "eps_key", "settings_id", "metric", "condition"]
    for a, b in combinations(order, 2):
        da = df[df["label"] == a].set_index(cond)
        db = df[df["label"] == b].set_index(cond)
        for key in da.index.intersection(db.index):
            ra, rb = da.loc[key].to_dict(), db.loc[key].to_dict()
            ra.update(dict(zip(cond, key)))
            rb.update(dict(zip(cond, key)))
            c = compare_rows(ra, rb, inp.records, n_boot=n_boot, seed=seed)
            rows.append({**dict(zip(cond, key)), "setting": ra.get("setting", ""), "norm": ra.get("norm", ""),
                         "model_a": a, "model_b": b,
                         "value_a": ra["value"],
                         "value_b": rb["value"], "delta": c.delta, "test": c.test, "n_paired": c.n,
                         "pvalue": c.pvalue, "p_floor": c.p_floor,
                         "significant": (c.pvalue is not None and c.pvalue < 0.05),
                         "note": c.note})
    out = pd.DataFrame(rows)
    if len(out):
        out = out.rename(columns={"eps_key": "eps"})
    return out

