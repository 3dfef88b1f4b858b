"""A run's numbers as RobustBench's ``model_info`` entry (and the corruption CSV's row): what the run knows, from
its verified records; what it cannot know (paper title, authors, venue, link, ...) from the caller.

Fields and types are RobustBench's (``core/robustbench.py``, read from its repository with the commit recorded):
accuracies are strings of percent with two decimals; ``external`` is the converged value of ``--converge`` where it
is lower than AutoAttack's (RobustBench fills it from an external evaluation that found less; the leaderboard shows
it as the best known robust accuracy), with a footnote naming the ladder and its status either way; ``unreliable`` is
true when a gradient-masking diagnostic fired or the ladder did not converge. The threat model is the AutoAttack
condition's: ``autoattack`` (Linf) or ``autoattack_l2`` (L2). Pandas only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from ..core import robustbench as rb
from ..core.labels import eps_text
from ..core.version import __version__
from ..errors import UserError

UNKNOWN = ("name", "authors", "venue", "link", "reported")  # the run cannot know them: given, or left ""


@dataclass
class Given:
    """What the caller says about the model (``export`` options); None: not given."""

    model_id: Optional[str] = None
    name: Optional[str] = None  # the paper's title (RobustBench's field "name")
    authors: Optional[str] = None
    venue: Optional[str] = None
    link: Optional[str] = None
    reported: Optional[str] = None
    architecture: Optional[str] = None
    additional_data: Optional[bool] = None
    forward_passes: Optional[int] = None
    eps: Optional[float] = None


@dataclass
class Entry:
    """The entry, its threat model folder, and what it was built from."""

    info: Dict[str, Any]
    threat: str  # "Linf", "L2" or "corruptions"
    condition: Optional[Dict[str, Any]] = None  # the condition whose images go with it (attack, eps)
    missing: List[str] = field(default_factory=list)  # fields the run cannot know and nobody gave
    notes: List[str] = field(default_factory=list)
    unaggregated: Optional[pd.DataFrame] = None  # corruptions: accuracy per (corruption, severity), as fractions


def pct(value: float) -> str:
    return f"{float(value):.2f}"


def _top1(summary: pd.DataFrame, attack: str, eps: Optional[float] = None) -> pd.DataFrame:
    rows = summary[(summary["attack"] == attack) & (summary["metric"] == "top1")]
    if eps is not None:
        rows = rows[np.isclose(rows["eps"].astype(float), eps, rtol=0, atol=1e-9)]
    return rows


def comparability(info: Dict[str, Any], n: int) -> Tuple[bool, List[str]]:
    """Is this run RobustBench-comparable (its provenance says so), and if not, why not."""
    lb = info.get("leaderboard") or {}
    if lb.get("name") != rb.NAME:
        return False, [f"not run with --suite {rb.NAME} (RobustBench's eps and sample set)"]
    return bool(lb.get("comparable")), list(lb.get("reasons") or [])


def _common(info: Dict[str, Any], given: Given, dataset: str) -> Tuple[Dict[str, Any], List[str]]:
    missing = [k for k in UNKNOWN if getattr(given, k) is None]
    base = {"link": given.link or "", "name": given.name or "", "authors": given.authors or "",
            "additional_data": bool(given.additional_data),
            "number_forward_passes": int(given.forward_passes) if given.forward_passes is not None else 1,
            "dataset": dataset, "venue": given.venue or "",
            "architecture": given.architecture or str(info.get("arch") or info.get("model") or "")}
    if given.additional_data is None:
        missing.append("additional_data (false)")
    if given.forward_passes is None:
        missing.append("number_forward_passes (1)")
    return base, missing


AUTOATTACKS = {"autoattack": ("Linf", "linf"), "autoattack_l2": ("L2", "l2")}  # attack -> (threat, norm)


def _threat_attack(summary: pd.DataFrame, info: Dict[str, Any]) -> str:
    """The AutoAttack condition an entry reports: the leaderboard's threat model for a leaderboard run, else the
    one threat model the run has AutoAttack in."""
    present = [a for a in AUTOATTACKS if not _top1(summary[summary["benchmark"] == "adversarial"], a).empty]
    if not present:
        raise UserError(f"{info.get('path')}: no AutoAttack condition, and a RobustBench entry reports AutoAttack's "
                        f"robust accuracy: run `evaluate --attack autoattack --eps 4/255 --save-adv` (L2: --attack "
                        f"autoattack_l2 --eps 0.5; or --suite robustbench / robustbench-l2) and export that run")
    board = (info.get("leaderboard") or {}).get("threat_model")
    chosen = [a for a in present if AUTOATTACKS[a][0] == board] or present
    if len(chosen) > 1:
        raise UserError(f"{info.get('path')}: AutoAttack ran in both the Linf and the L2 threat model; a RobustBench "
                        f"entry is one of them: export a run with one")
    return chosen[0]


def linf_entry(records: pd.DataFrame, summary: pd.DataFrame, info: Dict[str, Any], given: Given) -> Entry:
    """The Linf or L2 entry of an AutoAttack run (``--converge`` in the same threat model adds the external
    evaluation where it found less)."""
    from ..results.report.diagnostics import diagnose

    if info.get("protocol") != "standard":
        raise UserError(f"{info.get('path')} ran the {info.get('protocol')!r} protocol (normalised eps, no clipping, the "
                        f"model's own labels): not RobustBench's threat model; export a --protocol standard run")
    attack = _threat_attack(summary, info)
    threat, norm = AUTOATTACKS[attack]
    aa = _top1(summary, attack)
    aa = aa[aa["benchmark"] == "adversarial"]
    eps_all = sorted(set(aa["eps"].astype(float)))
    eps = given.eps
    if eps is None:
        board = (info.get("leaderboard") or {}).get("eps")
        eps = next((e for e in eps_all if board and eps_text(e, norm) == board), None)
        if eps is None and len(eps_all) == 1:
            eps = eps_all[0]
    if eps is None or _top1(aa, attack, eps).empty:
        raise UserError(f"{info.get('path')}: AutoAttack ran at {', '.join(eps_text(e, norm) for e in eps_all)}; "
                        f"choose the entry's eps with --eps (one of them)")
    row = _top1(aa, attack, eps).iloc[0]
    clean = _top1(summary[summary["benchmark"] == "adversarial"], "clean")
    n = int(row["n"])
    base, missing = _common(info, given, str(info.get("dataset")))
    entry = {**base, "eps": eps_text(eps, norm), "clean_acc": pct(clean["value"].iloc[0]),
             "reported": given.reported or "", "autoattack_acc": pct(row["value"])}
    ok, why = comparability(info, n)
    sample_text = "RobustBench's sample set" if ok else "not RobustBench-comparable: " + "; ".join(why)
    foot = [f"Evaluated with robustbench_pid {__version__}: AutoAttack (standard), {threat} {eps_text(eps, norm)}, "
            f"on {n:,} {info.get('dataset')} images ({sample_text})."]
    reasons = [f"diagnostic {f.code}" for f in diagnose(records)]
    conv = _top1(summary, "converge", eps)
    if "norm" in conv.columns:
        conv = conv[conv["norm"].fillna("linf").astype(str) == norm]
    condition = {"attack": attack, "eps": eps}
    if not conv.empty:
        c = conv.iloc[0]
        status = str(c.get("status", ""))
        rungs = _rungs(records, eps)
        if round(float(c["value"]), 2) < round(float(row["value"]), 2):  # lower at the entry's two decimals
            entry["external"] = pct(c["value"])
            foot.append(f"{pct(c['value'])}% robust accuracy is the converged value of robustbench_pid's --converge "
                        f"ladder ({rungs}), status: {status}; below AutoAttack's.")
            condition = {"attack": "converge", "eps": eps}
        else:
            foot.append(f"robustbench_pid's --converge ladder ({rungs}, status: {status}) found no more than AutoAttack "
                        f"({pct(c['value'])}%), so the entry has no external evaluation.")
        if status != "converged":
            reasons.append(f"the ladder's status is {status!r}")
    if reasons:
        foot.append("Potentially unreliable: " + "; ".join(dict.fromkeys(reasons)) + ".")
    entry["footnote"] = " ".join(foot)
    entry["unreliable"] = bool(reasons)
    notes = [] if ok else [f"this entry is not RobustBench-comparable: {'; '.join(why)}"]
    return Entry(_ordered(entry), threat, condition, missing, notes)


def _rungs(records: pd.DataFrame, eps: float) -> str:
    rows = records[(records["attack"] == "converge") & np.isclose(records["eps"].astype(float), eps, rtol=0, atol=1e-9)]
    labels = str(rows["converge_labels"].iloc[0]) if "converge_labels" in rows.columns and len(rows) else ""
    return "rungs that ran: " + (", ".join(dict.fromkeys(x for x in labels.split(",") if x)) or "not recorded")


def corruption_entry(records: pd.DataFrame, summary: pd.DataFrame, info: Dict[str, Any], given: Given) -> Entry:
    """The corruptions entry and the unaggregated row (accuracy per corruption and severity, as fractions, in
    RobustBench's column order; ``corruptions_acc`` is the mean of RobustBench's 15 x 5 cells, as its
    ``corruptions_evaluation`` computes it)."""
    rec = records[records["corruption"].fillna("").astype(str) != ""]
    acc = rec.groupby(["corruption", "severity"], sort=False)["correct_top1"].mean()
    order = [c for c in rb.corruption_order() if c in set(acc.index.get_level_values(0))]
    others = sorted(set(acc.index.get_level_values(0)) - set(order))
    cols = pd.MultiIndex.from_tuples([(c, int(s)) for c in order + others for s in sorted(acc[c].index)])
    model_id = given.model_id or str(info.get("model"))
    table = pd.DataFrame([[float(acc[c][s]) for c, s in cols]], index=[model_id], columns=cols)
    clean = _top1(summary, "clean")
    if clean.empty:
        raise UserError(f"{info.get('path')}: the run has no clean condition, and a corruptions entry reports clean "
                        f"accuracy: re-run it with the clean images (--suite robustbench-corruptions scores them; "
                        f"ImageNet-C: --imagenet-root DIR)")
    dataset = rb.board_dataset(str(info.get("dataset")))
    base, missing = _common(info, given, dataset)
    scored = [float(acc[c][s]) for c in order for s in sorted(acc[c].index)]
    entry = {**base, "eps": None, "clean_acc": pct(clean["value"].iloc[0]), "reported": given.reported or "",
             "corruptions_acc": pct(100 * float(np.mean(scored)))}
    mce = summary[summary["metric"] == "mce"]
    if not mce.empty:
        entry["corruptions_mce"] = pct(mce["value"].iloc[0])
    full = len(order) == 15 and all(len(acc[c]) == 5 for c in order)
    n = int(rec.groupby(["corruption", "severity"])["sample_id"].nunique().min())
    ok, why = comparability(info, n)
    why = ([] if full else ["not all 15 corruptions x 5 severities ran"]) + (why if not ok else [])
    foot = (f"Evaluated with robustbench_pid {__version__}: {len(acc)} corruption x severity conditions on {n:,} "
            f"images per condition" + (f" (not RobustBench-comparable: {'; '.join(why)})" if why else
                                       " (RobustBench's released data and n per cell)")
            + (". corruptions_mce is against AlexNet's published errors (Hendrycks & Dietterich 2019)."
               if "corruptions_mce" in entry else "."))
    entry["footnote"] = foot
    notes = [f"this entry is not RobustBench-comparable: {'; '.join(why)}"] if why else []
    return Entry(_ordered(entry), "corruptions", None, missing, notes, unaggregated=table)


def _ordered(entry: Dict[str, Any]) -> Dict[str, Any]:
    """Fields in the order RobustBench's files list them."""
    order = rb.field_order()
    return {k: entry[k] for k in sorted(entry, key=lambda k: order.index(k) if k in order else len(order))}


def check_entry(entry: Dict[str, Any], threat: str) -> List[str]:
    """What in ``entry`` does not fit RobustBench's field list: unknown fields, missing required ones, wrong types."""
    fields = rb.model_info_fields()
    out = [f"unknown field {k!r}" for k in entry if k not in fields]
    out += [f"missing field {k!r}" for k, f in fields.items() if threat in f["required"] and k not in entry]
    out += [f"field {k!r}: {v!r} is not {fields[k]['type']}" for k, v in entry.items()
            if k in fields and not rb.check_value(k, v)]
    return out
