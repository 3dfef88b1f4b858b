"""Tidy rows of corruption records (benchmarks ``corruptions`` and ``imagenet_c``).

Rows (values in percent): ``top1``/``top5`` per condition; ``err_<corruption>`` (top-1 error averaged
over the 5 severities, for a corruption run at all 5) and ``mean_err`` (over the 15 mCE corruptions), always; ``ce_<corruption>``,
``mce``, ``relative_mce`` when a baseline exists: AlexNet's published errors for ``imagenet`` and
``imagenet-c`` (ImageNet validation images), otherwise the model named by ``ce_baseline`` whose
records for the same dataset, split and samples are in the same records / results store
(AlexNet's constants only hold for ImageNet). The ``ce_baseline`` column says which baseline a row
used.
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import pandas as pd

from ...core.imagenet_info import ALEXNET_CLEAN_ERR, ALEXNET_MEAN_ERR, CORRUPTIONS_15, SEVERITIES
from ..stats.metrics import corruption_errors, relative_mean_corruption_error
from . import summarizers
from .accuracy import ID_COLUMNS, accuracy_rows, concat_rows, skipped_rows

# AlexNet's published errors are for ImageNet validation images (ImageNet-C): only these datasets use them.
ALEXNET_DATASETS = ("imagenet", "imagenet-c")


def _errors(g: pd.DataFrame) -> Dict[str, Dict[int, float]]:
    """corruption -> severity -> top-1 error in [0, 1]; the clean error under key 'clean'."""
    out: Dict[str, Dict[int, float]] = {}
    for (c, sev), h in g.groupby(["corruption", "severity"], sort=False):
        out.setdefault(str(c) or "clean", {})[int(sev)] = 1.0 - float(h["correct_top1"].astype(float).mean())
    return out


def _row(base: Dict[str, Any], metric: str, value: float, n: int, attack: str, **extra: Any) -> Dict[str, Any]:
    return {**base, "attack": attack, "eps": 0.0, "metric": metric, "value": float(value), "n": int(n),
            "ci_low": float("nan"), "ci_high": float("nan"), **extra}


def _complete(errs: Dict[str, Dict[int, float]], names: Sequence[str]) -> List[str]:
    return [c for c in names if c in errs and len(errs[c]) == len(SEVERITIES)]


def _baseline_errors(records: pd.DataFrame, baseline: str, key: Dict[str, Any],
                     sample_ids: set) -> Optional[Dict[str, Dict[int, float]]]:
    cand = records[((records["model"] == baseline) | (records["run_id"] == baseline))
                   & (records["dataset"] == key["dataset"])]
    if "split" in cand and "split" in key:
        cand = cand[cand["split"] == key["split"]]
    found = []
    for rid, g in cand.groupby("run_id", sort=True):
        if set(g.loc[g["corruption"] == "", "sample_id"]) == sample_ids:
            found.append((rid, g))
    if not found:
        return None
    if len(found) > 1:
        warnings.warn(f"several runs of CE baseline {baseline!r} match; using {found[-1][0]}")
    return _errors(found[-1][1])


def corruption_rows(records: pd.DataFrame, baseline: Optional[str] = None) -> pd.DataFrame:
    """Tidy rows of corruption records (any benchmark that writes them: corruptions, imagenet_c).

    ``baseline`` names the model (or run id) whose errors normalize CE/mCE outside ImageNet; it is
    only ever this argument (``--ce-baseline`` / ``load_results(..., ce_baseline=)``), never read
    from the environment, so the same records always give the same rows."""
    parts = [accuracy_rows(records, ("attack", "eps"))]
    keys = [c for c in ID_COLUMNS if c in records.columns]
    rows: List[Dict[str, Any]] = []
    for gkey, g in records.groupby(keys, sort=False, dropna=False):
        base = dict(zip(keys, gkey if isinstance(gkey, tuple) else (gkey,)))
        errs = _errors(g)
        cname = g["corruption"].replace("", "clean")
        n_per = {c: int((cname == c).sum() // max(1, len(errs.get(c, {})))) for c in errs}
        n = n_per.get("clean") or max(n_per.values(), default=0)
        for c in _complete(errs, [c for c in errs if c != "clean"]):  # a mean over some severities is another number
            rows.append(_row(base, f"err_{c}", 100.0 * float(np.mean(list(errs[c].values()))), n_per[c], c))
        done15 = _complete(errs, CORRUPTIONS_15)
        if len(done15) == len(CORRUPTIONS_15):
            rows.append(_row(base, "mean_err", 100.0 * float(np.mean([np.mean(list(errs[c].values()))
                                                                       for c in done15])), n, "corruptions"))
        per_sev = {c: [errs[c][s] for s in sorted(errs[c])] for c in errs if c != "clean"}
        clean_err = errs.get("clean", {}).get(0)
        if str(base.get("dataset")) in ALEXNET_DATASETS:
            ref: Optional[Dict[str, Any]] = dict(ALEXNET_MEAN_ERR)
            ref_clean: Optional[float] = ALEXNET_CLEAN_ERR
            label = "alexnet"
            names = [c for c in done15]
        elif baseline and str(base.get("model")) != baseline and str(base.get("run_id")) != baseline:
            key = {"dataset": base.get("dataset"), "split": g["split"].iloc[0] if "split" in g else None}
            sids = set(g.loc[g["corruption"] == "", "sample_id"])
            berrs = _baseline_errors(records, baseline, key, sids)
            if berrs is None:
                warnings.warn(f"CE baseline {baseline!r} has no records for dataset {key['dataset']!r} on the same "
                              f"samples in these results; only unnormalized errors are reported")
                ref = None
            else:
                # CE over all severities, the same ones on both sides (by severity, not by count)
                names = [c for c in per_sev if c in berrs and set(berrs[c]) == set(errs[c]) == set(SEVERITIES)]
                zero = [c for c in names if np.mean(list(berrs[c].values())) <= 0]
                if zero:
                    warnings.warn(f"CE baseline {baseline!r} makes no errors on {', '.join(zero)}: CE undefined "
                                  f"there (and so mCE); evaluate more samples")
                    names = [c for c in names if c not in zero]
                ref = {c: [berrs[c][s] for s in sorted(berrs[c])] for c in names}
                ref_clean = berrs.get("clean", {}).get(0)
                label = baseline
        else:
            ref = None
        if ref is None:
            continue
        ces = corruption_errors({c: per_sev[c] for c in names}, ref)
        for c, v in ces.items():
            rows.append(_row(base, f"ce_{c}", v, n_per[c], c, ce_baseline=label))
        if names and set(CORRUPTIONS_15) <= set(names):
            rows.append(_row(base, "mce", float(np.mean([ces[c] for c in CORRUPTIONS_15])), n, "corruptions",
                             ce_baseline=label))
            if clean_err is not None and ref_clean is not None:
                try:
                    rel = relative_mean_corruption_error({c: per_sev[c] for c in CORRUPTIONS_15}, clean_err,
                                                         {c: ref[c] for c in CORRUPTIONS_15}, ref_clean)
                    rows.append(_row(base, "relative_mce", rel, n, "corruptions", ce_baseline=label))
                except ValueError as exc:
                    warnings.warn(f"relative mCE undefined: {exc}")
    if rows:
        parts.append(pd.DataFrame(rows))
    return concat_rows(parts)


@summarizers.register("corruptions")
def corruptions_summary(records: pd.DataFrame, ce_baseline: Optional[str] = None) -> pd.DataFrame:
    return corruption_rows(records, baseline=ce_baseline)


@summarizers.register("imagenet_c")
def imagenet_c_summary(records: pd.DataFrame, ce_baseline: Optional[str] = None) -> pd.DataFrame:
    """Corruption rows plus the unreadable-image count (ImageNet-C is normalized by AlexNet)."""
    return concat_rows([corruption_rows(records, baseline=ce_baseline), skipped_rows(records)])


def corruptions_acc_rows(records: pd.DataFrame) -> pd.DataFrame:
    """RobustBench's ``corruptions_acc``: the mean accuracy over its 15 corruptions x 5 severities (each cell's own
    accuracy, then the mean of the 75), in percent; only where all 75 cells ran (a mean over fewer is another
    number)."""
    from ...core.robustbench import corruption_order

    keys = [c for c in ID_COLUMNS if c in records.columns]
    cells = [(c, s) for c in corruption_order() for s in SEVERITIES]
    rows: List[Dict[str, Any]] = []
    for gkey, g in records.groupby(keys, sort=False, dropna=False):
        base = dict(zip(keys, gkey if isinstance(gkey, tuple) else (gkey,)))
        acc = g.groupby(["corruption", "severity"], sort=False)["correct_top1"].agg(["mean", "size"])
        if not all(cell in acc.index for cell in cells):
            continue
        rows.append(_row(base, "corruptions_acc", 100.0 * float(np.mean([acc.loc[cell, "mean"] for cell in cells])),
                         int(acc.loc[cells[0], "size"]), "corruptions"))
    return pd.DataFrame(rows)


@summarizers.register("robustbench_corruptions")
def robustbench_corruptions_summary(records: pd.DataFrame, ce_baseline: Optional[str] = None) -> pd.DataFrame:
    """The corruption rows (mCE against AlexNet for ImageNet) plus RobustBench's ``corruptions_acc``."""
    return concat_rows([corruption_rows(records, baseline=ce_baseline), corruptions_acc_rows(records),
                        skipped_rows(records)])
