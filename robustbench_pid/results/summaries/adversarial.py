"""Tidy rows of the ``adversarial`` benchmark: accuracy per condition plus a derived ``worst-case``
row per (norm, eps): a sample is robust only if it survived every worst-case attack run at that
eps (as AutoAttack reports its ensemble)."""
from __future__ import annotations

from typing import Optional

import pandas as pd

from ..conditions import META_COLUMNS, WORST_CASE, add_identity, combined, worst_case_meta
from . import summarizers
from ..report.evidence_rows import evidence_rows
from .accuracy import ID_COLUMNS, accuracy_rows, concat_rows


def worst_case_records(records: pd.DataFrame) -> pd.DataFrame:
    """Per sample and (norm, eps): correct only if correct under every worst-case attack run there.

    Runs at the same eps but with different norms are never combined (an L1 eps is not an L-inf
    one); attacks that are not a worst case (noise) are left out. Only groups with at least two
    distinct attack runs are returned; only samples present in every run of the group are counted.
    ``over`` names the runs combined. The norm and worst-case flag come from the records' columns
    (``conditions.META_COLUMNS``; derived for records written without them).
    """
    if records.empty or "attack" not in records:
        return pd.DataFrame()
    adv = records[~records["attack"].isin(["clean", WORST_CASE])]
    if "benchmark" in adv.columns:  # --converge's ladder is its own worst case, with its own rows
        adv = adv[adv["benchmark"].astype(str) != "converge"]
    if adv.empty:
        return pd.DataFrame()
    adv = add_identity(adv)
    adv = adv[adv["worst_case"].astype(bool) & (adv["norm"].astype(str) != "")]
    ids = [c for c in ID_COLUMNS if c in adv.columns]
    out = []
    for key, g in adv.groupby(ids + ["norm", "eps", "precision"], sort=False, dropna=False):
        runs = g.drop_duplicates("settings_id")
        if len(runs) < 2:
            continue
        g = g.assign(_run=g["settings_id"], **{c: _correct(g, c) for c in ("correct_top1", "correct_top5")})
        per = g.groupby("sample_id", sort=False).agg(
            n_runs=("_run", "nunique"), correct_top1=("correct_top1", "all"), correct_top5=("correct_top5", "all"))
        per = per[per["n_runs"] == len(runs)].drop(columns="n_runs").reset_index()
        base = dict(zip(ids + ["norm", "eps", "precision"], key))
        for k, v in base.items():
            per[k] = v
        per["attack"] = WORST_CASE
        per["over"] = "+".join(sorted(runs["attack"].unique()))
        # a worst case is its own condition: the identity of exactly the attacks it combines
        per["settings_id"] = combined(runs["settings_id"])
        per["setting"] = "worst case over " + " + ".join(sorted(runs["setting"]))
        per["settings"] = "+".join(sorted(runs["settings_id"]))
        for col, v in worst_case_meta(runs[list(META_COLUMNS)].to_dict("records")).items():
            per[col] = v
        out.append(per)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def _correct(g: pd.DataFrame, col: str) -> pd.Series:
    """Correct under this attack and on the clean image (the paper protocol's attack verdicts do not
    include the clean one: a sample misclassified clean may be "correct" on its perturbed tensor, and a
    worst case above clean accuracy is no worst case); a missing verdict counts as not correct."""
    ok = g[col].astype("boolean").fillna(False).astype(bool)
    clean = "clean_" + col
    if clean in g.columns:
        ok &= g[clean].astype("boolean").fillna(False).astype(bool)
    return ok


def worst_case_rows(records: pd.DataFrame) -> pd.DataFrame:
    """Tidy accuracy rows (attack = ``worst-case``) of :func:`worst_case_records`."""
    wc = worst_case_records(records)
    if wc.empty:
        return pd.DataFrame()
    return accuracy_rows(wc, ("attack", "eps", "over"))


@summarizers.register("adversarial")
def adversarial_rows(records: pd.DataFrame, ce_baseline: Optional[str] = None) -> pd.DataFrame:
    """Accuracy per condition plus the worst-case rows (``ce_baseline`` is not used here)."""
    rows = accuracy_rows(records, ("attack", "eps"))
    worst = worst_case_rows(records)
    return concat_rows([rows, worst, evidence_rows(records)])  # + passes, indicators, agreement
