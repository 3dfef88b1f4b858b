"""Gradient-masking diagnostics: pure functions from records (or tidy results) to findings.

A low robust accuracy is only believable if the attacks behind it were working. These checks look
for the usual signs that they were not (Athalye et al. 2018; Carlini et al. 2019, "On evaluating
adversarial robustness", sec. 5; Croce & Hein 2020):

- ``eps-not-monotone``: accuracy under a worst-case attack rises with eps (a larger ball contains
  the smaller one, so a working attack can only do better);
- ``pgd-above-fgsm``: PGD (many steps) leaves more accuracy than FGSM (one step) at the same eps;
- ``black-box-beats-white-box``: a score-based attack (SPSA, Square) gets lower than every white-box
  gradient attack (FGSM, PGD, ...) of the same norm at the same eps, i.e. the gradients are less
  useful than random search;
- ``unbounded-not-zero``: the unbounded run of an attack (``--indicators`` adds it: eps covering the whole
  pixel box) still leaves samples correctly classified, which a working attack never does (Carlini et al.
  2019, sec. 5.2). Nothing is concluded from the size of an eps alone: an adversarially trained model keeps
  most of its accuracy at the field's standard MNIST eps (0.3), where no image is erased;
- ``zero-gradients``: a noticeable share of attacked samples had an all-zero input gradient;
- ``constant-predictions`` (broken model): every sample gets the same clean prediction although
  the labels differ, i.e. the outputs do not depend on the input (NaN-free but dead weights, a
  saturated or wrongly loaded checkpoint); every accuracy of such a run is meaningless;
- ``attack-moved-nothing``: an attack with eps > 0 left every attacked sample exactly where it was
  (all perturbation norms 0): its row is clean accuracy under another name (zero or masked gradients).

Which attacks are white box, worst case and of which norm is read from the ``white_box``,
``worst_case`` and ``norm`` columns of the records and tidy rows (``conditions.META_COLUMNS``), so
diagnosing results never imports the attacks. Each check compares runs of one model, checkpoint,
dataset and protocol only. Differences smaller
than ``tol`` percentage points are ignored (one sample of 360 is 0.28 points). Every finding says
what was seen and what to try.
"""
from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any, Callable, List, Optional

import pandas as pd

from ...core.labels import eps_text

from ..conditions import WORST_CASE, with_attack_meta

RUN_KEYS = ["model", "checkpoint_sha256", "dataset", "protocol"]


@dataclass
class Finding:
    """One diagnostic finding. ``code`` names the check; ``value`` is the number that triggered it."""

    code: str
    message: str
    severity: str = "warning"
    model: str = ""
    protocol: str = ""
    attack: str = ""
    eps: Optional[float] = None
    value: Optional[float] = None


def _norm(rows: pd.DataFrame) -> str:
    """The norm (unit of eps) of a group of one attack's rows, "" when not recorded."""
    return str(rows["norm"].iloc[0]) if "norm" in rows.columns and len(rows) else ""


def _tidy(data: pd.DataFrame) -> pd.DataFrame:
    """Tidy top-1 rows of the adversarial benchmark, from records or from tidy results."""
    if "sample_id" in data.columns:  # per-sample records
        from ..store import summarize

        data = summarize(data)
    if data.empty or "metric" not in data:
        return pd.DataFrame(columns=RUN_KEYS + ["attack", "eps", "value", "n", "norm", "white_box", "worst_case"])
    df = data[data["metric"] == "top1"]
    if "benchmark" in df:
        df = df[df["benchmark"] == "adversarial"]
    df = with_attack_meta(df[~df["attack"].isin(["clean", WORST_CASE])]).copy()
    for k in RUN_KEYS:
        if k not in df:
            df[k] = ""
    df[RUN_KEYS] = df[RUN_KEYS].astype(object).fillna("")
    return df


def _groups(df: pd.DataFrame):
    for key, g in df.groupby(RUN_KEYS, sort=False, dropna=False):
        yield dict(zip(RUN_KEYS, key)), g


def _worst_case(rows: pd.DataFrame) -> pd.Series:
    """Rows of attacks that search their eps-ball for a misclassification (noise does not)."""
    return rows["worst_case"].astype(bool) & (rows["norm"].astype(str) != "")


def check_eps_monotone(data: pd.DataFrame, tol: float = 1.0) -> List[Finding]:
    """Accuracy must not rise with eps under the same attack (same settings but eps)."""
    df = _tidy(data)
    out: List[Finding] = []
    for ids, g in _groups(df):
        for attack, ga in g[_worst_case(g)].groupby("attack", sort=False):
            # the same attack at several eps (min over its settings at each eps: the strongest run)
            s = ga.groupby("eps")["value"].min().sort_index()
            for (e0, v0), (e1, v1) in zip(s.items(), list(s.items())[1:]):
                if v1 > v0 + tol:
                    out.append(Finding(
                        "eps-not-monotone",
                        f"{ids['model']} ({ids['protocol']}): {attack} accuracy rises from {v0:.2f}% at eps "
                        f"{eps_text(e0, _norm(ga))} to {v1:.2f}% at {eps_text(e1, _norm(ga))}; a larger ball contains the smaller "
                        f"one, so the attack is failing (gradient masking or too few/too large steps): add "
                        f"steps or restarts, check the step size, try a black-box attack.",
                        model=ids["model"], protocol=ids["protocol"], attack=attack, eps=float(e1),
                        value=float(v1 - v0)))
    return out


def _on_shared_samples(records: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Top-1 rows of attacks ``a`` and ``b`` recomputed on the samples both were run on (per model, protocol and
    eps), so two runs of different sample sets are not compared as if they were one."""
    from ..store import summarize

    r = records[records["attack"].isin([a, b])]
    keys = [k for k in RUN_KEYS + ["eps"] if k in r.columns]
    parts = []
    for _, g in r.groupby(keys, sort=False, dropna=False):
        shared = set(g.loc[g["attack"] == a, "sample_id"]) & set(g.loc[g["attack"] == b, "sample_id"])
        parts.append(g[g["sample_id"].isin(shared)])
    sub = pd.concat(parts) if parts else r.iloc[:0]
    return summarize(sub) if len(sub) else sub


def check_pgd_vs_fgsm(data: pd.DataFrame, tol: float = 1.0) -> List[Finding]:
    """PGD should never leave more accuracy than FGSM at the same eps (on the samples both attacked)."""
    if "sample_id" in data.columns:
        data = _on_shared_samples(data, "pgd", "fgsm")
    df = _tidy(data)
    out: List[Finding] = []
    for ids, g in _groups(df):
        pgd = g[g["attack"] == "pgd"].groupby("eps")["value"].min()
        fgsm = g[g["attack"] == "fgsm"].groupby("eps")["value"].min()
        for eps in sorted(set(pgd.index) & set(fgsm.index)):
            if pgd[eps] > fgsm[eps] + tol:
                out.append(Finding(
                    "pgd-above-fgsm",
                    f"{ids['model']} ({ids['protocol']}): PGD leaves {pgd[eps]:.2f}% at eps {eps_text(eps, 'linf')}, "
                    f"more than FGSM's {fgsm[eps]:.2f}%; an iterative attack that does worse than its own first "
                    f"step points to a noisy or masked gradient (or a too-small step size).",
                    model=ids["model"], protocol=ids["protocol"], attack="pgd", eps=float(eps),
                    value=float(pgd[eps] - fgsm[eps])))
    return out


def check_black_box(data: pd.DataFrame, tol: float = 1.0) -> List[Finding]:
    """A score-based attack beating every white-box attack of its norm at the same eps."""
    df = _tidy(data)
    out: List[Finding] = []
    for ids, g in _groups(df):
        g = g[_worst_case(g)]
        is_white = g["white_box"].astype(bool)
        for (norm, bb), gb in g[~is_white].groupby(["norm", "attack"], sort=False):
            white = g[is_white & (g["norm"] == norm)].groupby("eps")["value"].min()
            black = gb.groupby("eps")["value"].min()
            for eps in sorted(set(black.index) & set(white.index)):
                if black[eps] < white[eps] - tol:
                    out.append(Finding(
                        "black-box-beats-white-box",
                        f"{ids['model']} ({ids['protocol']}): {bb} (gradient-free) leaves {black[eps]:.2f}% at eps "
                        f"{eps_text(eps, norm)}, below the best white-box attack's {white[eps]:.2f}%; the gradients "
                        f"are less informative than random search, a classic sign of gradient masking: run "
                        f"AutoAttack and trust the lowest number.",
                        model=ids["model"], protocol=ids["protocol"], attack=bb, eps=float(eps),
                        value=float(white[eps] - black[eps])))
    return out


def _unbounded(df: pd.DataFrame) -> pd.DataFrame:
    from .indicators import UNCONSTRAINED

    if "condition" not in df.columns:
        return df.iloc[0:0]
    return df[df["condition"].astype(str) == UNCONSTRAINED]


def check_unbounded(data: pd.DataFrame, max_acc: float = 1.0) -> List[Finding]:
    """The unbounded run of each attack (``--indicators``) must leave (almost) no sample correct: an attack free
    to move anywhere in the pixel box that cannot flip a prediction is not working. Needs that run; without it
    this check says nothing (an eps, however large, is no evidence on its own)."""
    if "sample_id" in data.columns:  # records: the unbounded run is the condition --indicators named
        data = _unbounded(data)
        if data.empty:
            return []
        df = _tidy(data)
    else:
        df = _unbounded(_tidy(data))
    out: List[Finding] = []
    for ids, g in _groups(df):
        for attack, ga in g.groupby("attack", sort=False):
            v = float(ga["value"].min())
            if v > max_acc:
                out.append(Finding(
                    "unbounded-not-zero",
                    f"{ids['model']} ({ids['protocol']}): {attack} without a bound on the perturbation (eps "
                    f"{eps_text(float(ga['eps'].iloc[0]), _norm(ga))}, the whole pixel box) still leaves {v:.2f}% "
                    f"correct; an attack that works reaches 0% there, so its bounded rows are no evidence of "
                    f"robustness: check for masked or zero gradients, wrong labels or a wrong input space, and try a "
                    f"black-box attack (square, spsa) or --converge.",
                    model=ids["model"], protocol=ids["protocol"], attack=attack, eps=float(ga["eps"].iloc[0]), value=v))
    return out


def check_zero_gradients(records: pd.DataFrame, max_share: float = 0.05) -> List[Finding]:
    """Share of attacked samples whose input gradient was all zero (needs per-sample records)."""
    if "sample_id" not in records.columns or "grad_zero" not in records.columns:
        return []
    out: List[Finding] = []
    r = records[(records["attack"] != "clean") & records["grad_zero"].notna()]
    if "attacked" in r:
        r = r[r["attacked"].astype(bool)]
    if r.empty:
        return out
    r = r.copy()
    for k in RUN_KEYS:
        if k not in r:
            r[k] = ""
    r[RUN_KEYS] = r[RUN_KEYS].astype(object).fillna("")
    for key, g in r.groupby(RUN_KEYS + ["attack", "eps"], sort=False, dropna=False):
        share = float(g["grad_zero"].astype(bool).mean())
        if share > max_share:
            ids = dict(zip(RUN_KEYS + ["attack", "eps"], key))
            out.append(Finding(
                "zero-gradients",
                f"{ids['model']} ({ids['protocol']}): {100 * share:.1f}% of the samples attacked by {ids['attack']} "
                f"at eps {eps_text(ids['eps'], _norm(g))} had an all-zero input gradient; gradient attacks cannot move "
                f"them (saturated softmax, non-differentiable step or fp16 underflow): use a margin loss, fp32, "
                f"or a black-box attack.",
                model=ids["model"], protocol=ids["protocol"], attack=ids["attack"], eps=float(ids["eps"]),
                value=100 * share))
    return out


def _run_groups(records: pd.DataFrame, extra: List[str]):
    r = records.copy()
    for k in RUN_KEYS:
        if k not in r:
            r[k] = ""
    r[RUN_KEYS] = r[RUN_KEYS].astype(object).fillna("")
    for key, g in r.groupby(RUN_KEYS + extra, sort=False, dropna=False):
        yield dict(zip(RUN_KEYS + extra, key)), g


def check_constant_predictions(records: pd.DataFrame, min_samples: int = 8) -> List[Finding]:
    """Broken model: one clean prediction for every sample while the labels span several classes."""
    if "sample_id" not in records.columns or "clean_pred" not in records.columns or "label" not in records.columns:
        return []
    clean = records[records["attack"] == "clean"] if "attack" in records else records
    out: List[Finding] = []
    for ids, g in _run_groups(clean.drop_duplicates(subset=[c for c in ("run_id", "sample_id") if c in clean]), []):
        if len(g) < min_samples or g["label"].nunique() < 2 or g["clean_pred"].nunique() != 1:
            continue
        k = g["clean_pred"].iloc[0]
        out.append(Finding(
            "constant-predictions",
            f"{ids['model']} ({ids['protocol']}): all {len(g)} samples are predicted as class {k} although their "
            f"labels span {g['label'].nunique()} classes: the model's output does not depend on its input (a "
            f"broken or wrongly loaded checkpoint, dead/saturated weights, extreme --lambda-*/--model-arg "
            f"values). Every accuracy of this run is meaningless: check the checkpoint and model arguments.",
            severity="error", model=ids["model"], protocol=ids["protocol"], attack="clean", value=float(len(g))))
    return out


def check_attack_moved(records: pd.DataFrame) -> List[Finding]:
    """An attack with eps > 0 whose attacked samples all kept a perturbation of exactly 0."""
    norms = [c for c in ("pert_linf", "pert_l2", "pert_l1") if c in records.columns]
    if "sample_id" not in records.columns or not norms or "eps" not in records.columns:
        return []
    from .indicators import LIBRARY_ATTACKS

    # the library attacks (Square, AutoAttack and its parts) return the clean image where they fail, so all-zero
    # perturbations only say they broke nothing there; gradient-free attacks have no gradients to blame
    r = records[(records["attack"] != "clean") & (records["eps"] > 0) & ~records["attack"].isin(LIBRARY_ATTACKS)]
    if "white_box" in r.columns:
        r = r[r["white_box"].fillna(True).astype(bool)]
    if "attacked" in r:
        r = r[r["attacked"].astype(bool)]
    r = r[r[norms].notna().all(axis=1)]
    if r.empty:
        return []
    out: List[Finding] = []
    for ids, g in _run_groups(r, ["attack", "eps"]):
        if (g[norms].to_numpy() == 0).all():
            out.append(Finding(
                "attack-moved-nothing",
                f"{ids['model']} ({ids['protocol']}): {ids['attack']} at eps {eps_text(ids['eps'], _norm(g))} left all "
                f"{len(g)} attacked samples unchanged (every perturbation norm is 0), so its row only repeats "
                f"clean accuracy: the input gradients are zero or masked (or the model is broken). Do not report "
                f"it as robustness; try a black-box attack (square, spsa) or check the model.",
                severity="error", model=ids["model"], protocol=ids["protocol"], attack=ids["attack"],
                eps=float(ids["eps"]), value=float(len(g))))
    return out


CHECKS: List[Callable[[pd.DataFrame], List[Finding]]] = [
    check_eps_monotone, check_pgd_vs_fgsm, check_black_box, check_unbounded, check_zero_gradients]
RECORD_CHECKS: List[Callable[[pd.DataFrame], List[Finding]]] = [check_constant_predictions, check_attack_moved]


def diagnose(records: pd.DataFrame) -> List[Finding]:
    """Every check over per-sample records (or tidy results: the zero-gradient check then skips)."""
    if records is None or len(records) == 0:
        return []
    if "sample_id" in records.columns and "benchmark" in records.columns:
        records = records[records["benchmark"] == "adversarial"]
        if records.empty:
            return []
    tidy = _tidy(records)
    findings: List[Finding] = []
    for check in CHECKS[:-1]:
        per_sample = check in (check_pgd_vs_fgsm, check_unbounded) and "sample_id" in records.columns
        findings.extend(check(records if per_sample else tidy))
    findings.extend(check_zero_gradients(records))
    for check in RECORD_CHECKS:
        findings.extend(check(records))
    return findings


def checks_that_apply(records: Optional[pd.DataFrame]) -> List[str]:
    """The gradient-masking checks the data can feed (each needs something: several eps of one attack, PGD and
    FGSM at one eps, a black-box and a white-box attack, a large eps, recorded gradients). An empty list means
    no gradient-masking check could run, so "no signs" would say nothing."""
    if records is None or len(records) == 0:
        return []
    if "sample_id" in records.columns and "benchmark" in records.columns:
        records = records[records["benchmark"] == "adversarial"]
    tidy = _tidy(records)
    out: List[str] = []
    for ids, g in _groups(tidy):
        wc = g[_worst_case(g)]
        if (wc.groupby("attack")["eps"].nunique() > 1).any():
            out.append("eps-not-monotone")
        if set(g.loc[g["attack"] == "pgd", "eps"]) & set(g.loc[g["attack"] == "fgsm", "eps"]):
            out.append("pgd-above-fgsm")
        wb = g["white_box"].astype(bool)
        if (~wb & _worst_case(g)).any() and wb.any():
            out.append("black-box-beats-white-box")
        if len(_unbounded(g)):
            out.append("unbounded-not-zero")
    if "sample_id" in records.columns and len(_unbounded(records)):
        out.append("unbounded-not-zero")
    if "grad_zero" in records.columns and records["grad_zero"].notna().any():
        out.append("zero-gradients")
    return sorted(set(out))


def format_findings(findings: List[Finding], flagged: bool = False, applied: Optional[List[str]] = None) -> str:
    """Plain text for the terminal, one finding a line. ``flagged``: indicators of attack failure flag
    samples (``evidence_text.overestimate_note``), so "no signs" would claim more than the checks support.
    ``applied``: the gradient-masking checks the data could feed (:func:`checks_that_apply`; None: not known)."""
    if not findings and flagged:
        return ("diagnostics: the gradient-masking checks that ran found nothing, but the indicators flag samples the "
                "attack may not have solved (see the warning below): that is no evidence the numbers are sound")
    if not findings and applied is not None and not applied:
        return ("diagnostics: no gradient-masking check could run on these results (they need several eps of one "
                "attack, PGD and FGSM at one eps, a black-box beside a white-box attack, or recorded gradients): "
                "the robust accuracies are upper bounds that nothing here has checked")
    if not findings:
        which = f" ({', '.join(applied)})" if applied else ""
        return f"diagnostics: no gradient-masking signs or broken-model signs found by the checks that ran{which}"
    return "\n".join(["diagnostics:"] + [f"  [{f.severity}] {f.code}: {f.message}" for f in findings])


class DiagnosticWarning(UserWarning):
    """An ``[error]`` finding of :func:`diagnose` on a run ``rbp.evaluate`` just made (its numbers
    are not to be trusted); the CLI prints the same finding after its table."""


def attach_diagnostics(df: Any, records: pd.DataFrame, warn: bool = True) -> List[Finding]:
    """The API's share of what ``evaluate`` prints: the findings on a run's ``records`` in
    ``df.attrs["diagnostics"]`` (one dict per finding) and ``df.attrs["diagnostics_text"]``, each
    ``[error]`` finding raised as a :class:`DiagnosticWarning` unless ``warn`` is False
    (``rbp.evaluate(..., quiet=True)``)."""
    from .evidence_text import overestimate_note
    from ..store import summarize

    findings = diagnose(records)
    note = overestimate_note(summarize(records)) if "benchmark" in records.columns else ""
    df.attrs["diagnostics"] = [asdict(f) for f in findings]
    df.attrs["diagnostics_text"] = format_findings(findings, flagged=bool(note), applied=checks_that_apply(records)) + \
        (f"\n{note}" if note else "")
    if warn:
        for f in findings:
            if f.severity == "error":
                warnings.warn(f"[error] {f.code}: {f.message}", DiagnosticWarning, stacklevel=3)
    return findings
