"""Tidy rows and terminal text of the ``converge`` benchmark (the convergence ladder), pandas only.

Per condition (model, eps, the user's attacks and the ladder's settings):
- ``top1``: the converged robust accuracy (the per-sample worst case over every rung that ran);
- ``rung_top1``: robust accuracy after each rung, with its Wilson interval and the mean cumulative
  forward and backward passes per sample spent up to it (the convergence curve; ``rung`` names it);
- ``converge_gap``: the user's own attack (rung 0) minus the converged value, in points;
- ``converge_passes_forward`` / ``converge_passes_backward``: the ladder's mean passes per sample.
Every row carries the condition's ``status`` (``converged``, ``not converged``, ``upper bound:
gradients unavailable``, ``upper bound: gradients mislead``, ...; the worst over its chunks) and ``status_detail``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from ..stats.metrics import wilson_interval
from . import summarizers
from .accuracy import ID_COLUMNS, accuracy_rows, concat_rows

from .stop_rule import (BATCH_DEPENDENT, CONVERGED, MISLED, NOT_CONVERGED, RANDOM_OUTPUTS,  # noqa: F401
                        REDUCED, STATUSES, UPPER_BOUND, reductions_of, share_left, tolerance, verdict)

# The ladder's design revision (benchmarks/ladder/: rung order, rung 0, the probes), part of every
# converge unit's key, so a run folder of another revision is never resumed with this one, and recorded in its
# params, so a result of an earlier design says so (``ladder_design``). What each revision changed: docs/attacks.md,
# "Ladder revisions" (one list, there).
DESIGN = 15
MAX_ROUNDS = 16  # rung ids of later rounds carry "@r"; the order below lists them up to this round
ROUND_RUNGS = ("apgd-t", "apgd-ce", "fab-t", "square")  # a round's rungs, in the order they run


def rung_id(base: str, r: int) -> str:
    """The id of ``base`` in round ``r``: ``apgd-t`` in round 1, ``apgd-t@2`` in round 2."""
    return base if r == 1 else f"{base}@{r}"


# the rungs in the order the current ladder runs them ("probe": the passes of the instability/batch/gradient
# probes); "strong-flagged"/"strong-all": rungs of ladders recorded before the rounds existed (read back, never
# run). A condition's curve follows the order its records say the rungs ran in (``run_order``): earlier designs
# ran APGD-CE before APGD-T.
RUNG_ORDER = (("user", "probe", "eot-ce", "eot-dlr") + ROUND_RUNGS + ("strong-flagged", "spsa", "strong-all")
              + tuple(rung_id(b, r) for r in range(2, MAX_ROUNDS + 1) for b in ROUND_RUNGS))
RUNG_LABELS = {"user": "your attack", "eot-ce": "APGD-CE + EOT", "eot-dlr": "APGD-DLR + EOT", "apgd-ce": "APGD-CE",
               "strong-flagged": "APGD-CE strong (flagged)", "apgd-t": "APGD-T (ranked)", "fab-t": "FAB-T",
               "square": "Square", "spsa": "SPSA (no-gradient samples)", "strong-all": "APGD-DLR strong"}
RUNG_LABELS.update({rung_id(b, r): f"{RUNG_LABELS[b]}, round {r} (near samples, full budget)" for r in range(2, MAX_ROUNDS + 1)
                    for b in ROUND_RUNGS})
CONVERGE_METRICS = ("rung_top1", "converge_gap", "converge_passes_forward", "converge_passes_backward")


def ladder_design(params: Any) -> int:
    """The design revision that made a converge record (its ``params`` JSON); 0 if they cannot be read."""
    import json

    try:
        p = json.loads(str(params))
        return int(p.get("design") or (2 if "sweep_steps" in p["ladder"] else 1))
    except (KeyError, ValueError, TypeError, AttributeError):
        return 0


def is_converged(status: str) -> bool:
    """Only the full ladder's ``converged`` is; a reduced ladder's ``converged (reduced ladder: ...)`` is not."""
    return str(status) == CONVERGED


def _units(g: pd.DataFrame) -> pd.DataFrame:
    return g.drop_duplicates("unit") if "unit" in g.columns else g.head(1)


def condition_tolerance(g: pd.DataFrame) -> Optional[int]:
    """The ladder's tolerance for the whole condition (as if it were one work unit), from its recorded settings;
    None for records that do not carry them."""
    import json

    try:
        lad = json.loads(str(g["params"].iloc[0]))["ladder"]
        return tolerance(len(g), float(lad["tol_share"]), int(lad["tol_min"]))
    except (KeyError, ValueError, TypeError, IndexError):
        return None


EVIDENCE = ("margin_clean", "margin_gradient", "margin_free", "converge_grad_misleads", "converge_full_gradient",
            "converge_full_free", "converge_last_broke", "converge_tau")


def evidence(g: pd.DataFrame) -> Optional[pd.DataFrame]:
    """The stop rule's evidence table of a condition's records (``stop_rule.py``); None for records of a design
    before the rule was one function (design 11), which carry only their units' statuses."""
    if any(c not in g.columns for c in EVIDENCE):
        return None

    def flag(col: str) -> np.ndarray:
        return g[col].fillna(False).astype(bool).to_numpy() if col in g.columns else np.zeros(len(g), dtype=bool)

    robust = flag("correct_top1")
    last = flag("converge_last_broke").copy()
    if "unit" in g.columns:  # a unit whose last round broke its last robust samples has nothing left to find
        last &= g["correct_top1"].astype(bool).groupby(g["unit"]).transform("any").to_numpy()
    return pd.DataFrame({
        "robust": robust, "no_gradient": flag("grad_unavailable"), "misleads": flag("converge_grad_misleads"),
        "left_gradient": share_left(g["margin_gradient"].to_numpy(float), g["margin_clean"].to_numpy(float)),
        "left_free": share_left(g["margin_free"].to_numpy(float), g["margin_clean"].to_numpy(float)),
        "full_gradient": flag("converge_full_gradient") | ~robust, "full_free": flag("converge_full_free") | ~robust,
        "last_broke": last, "tau": pd.to_numeric(g["converge_tau"], errors="coerce").to_numpy(),
        "rivals": flag("converge_rivals"),  # design 12; absent (design 11): Square was nobody's rival
        # design 13; absent (design 12 and before): no sample was owed a fresh start
        "edge": (pd.to_numeric(g["converge_edge"], errors="coerce").fillna(0.0).to_numpy(float)
                 if "converge_edge" in g.columns else np.zeros(len(g))),
        "restarted": flag("converge_restarted"),
        "random": flag("converge_unstable"), "batch": flag("converge_batch_dependent")})


def condition_verdict(g: pd.DataFrame) -> Tuple[str, str]:
    """(status, detail) of a whole condition: the stop rule applied to all its work units' samples at once, with
    the condition's tolerance (each unit stopped on its own, so many small units could each leave a sample to their
    last round). Records of an earlier design: the worst of their units' statuses."""
    per_unit = _units(g)
    units = "; ".join(dict.fromkeys(per_unit["converge_detail"].astype(str)))
    ev, tol = evidence(g), condition_tolerance(g)
    if ev is None or tol is None:
        got = set(g["converge_status"].astype(str))
        for status in (UPPER_BOUND, BATCH_DEPENDENT, RANDOM_OUTPUTS, MISLED, NOT_CONVERGED):
            if status in got:
                return status, units
        if len(per_unit) > 1 or len(got) != 1:  # never a converged condition this design cannot judge
            return NOT_CONVERGED, (f"records of an earlier ladder design in {len(per_unit)} work units: each unit's "
                                   f"own status was converged, but they lack the evidence the condition-level rule "
                                   f"reads (re-run them); per unit: {units}")
        return next(iter(got)), units
    if "converge_reduced" in g.columns:  # the settings below the defaults, as each unit recorded them
        reduced = [r for r in str(g["converge_reduced"].iloc[0]).split(", ") if r]
    else:  # records without that column: the first unit's status that names them
        named = [reductions_of(st) for st in per_unit["converge_status"].astype(str)]
        reduced = next((r for r in named if r), [])
    status, detail = verdict(ev, tol, reduced)
    if len(per_unit) == 1:
        return status, detail
    st = per_unit["converge_status"].astype(str)
    ok = int((st == CONVERGED).sum() + st.str.startswith(REDUCED).sum())
    return status, f"{detail}; {ok} of {len(per_unit)} work units converged on their own"


def condition_status(g: pd.DataFrame) -> str:
    return condition_verdict(g)[0]


def _passes(g: pd.DataFrame, rung: str, kind: str) -> pd.Series:
    col = f"{kind}@{rung}"
    return pd.to_numeric(g[col], errors="coerce").fillna(0.0) if col in g.columns else pd.Series(0.0, index=g.index)


def run_order(g: pd.DataFrame) -> List[str]:
    """The rungs in the order the condition's ladders ran them (each unit's ``converge_rungs``, merged; the
    probes right after rung 0), then any other known rung in ``RUNG_ORDER``'s order."""
    seen: List[str] = []
    for rs in g["converge_rungs"].astype(str).unique():
        for r in rs.split(","):
            if r and r not in seen:
                seen.append(r)
    if "probe" not in seen:
        seen.insert(1 if seen[:1] == ["user"] else 0, "probe")
    return seen + [r for r in RUNG_ORDER if r not in seen]


def curve(g: pd.DataFrame) -> pd.DataFrame:
    """Robust accuracy after each rung that ran on some chunk, with cumulative mean passes per sample."""
    ran = {r for rs in g["converge_rungs"].astype(str).unique() for r in rs.split(",") if r}
    order = run_order(g)
    rungs = [r for r in order if r in ran]
    pos = {r: i for i, r in enumerate(order)}
    clean = g["clean_correct_top1"].astype(bool)
    broken = g["broken_by"].fillna("").astype(str).map(lambda r: pos.get(r, -1) if r else 10 ** 6)
    settings = rung_settings(g)
    rows: List[Dict[str, Any]] = []
    fwd = pd.Series(0.0, index=g.index)
    bwd = pd.Series(0.0, index=g.index)
    n = len(g)
    for r in order:
        fwd = fwd + _passes(g, r, "fwd")
        bwd = bwd + _passes(g, r, "bwd")
        if r not in rungs:
            continue
        k = int((clean & (broken > pos[r])).sum())
        lo, hi = wilson_interval(k, n)
        rows.append({"rung": r, "rung_index": len(rows), "rung_label": RUNG_LABELS.get(r, r), "value": 100.0 * k / n,
                     "n": n, "ci_low": 100.0 * lo, "ci_high": 100.0 * hi, "passes_forward_cum": float(fwd.mean()),
                     "passes_backward_cum": float(bwd.mean()), "rung_settings": settings.get(r, ""),
                     "rung_passes_forward": float(_passes(g, r, "fwd").mean()),
                     "rung_passes_backward": float(_passes(g, r, "bwd").mean()),
                     "rung_broke": int((g["broken_by"].fillna("").astype(str) == r).sum())})
    return pd.DataFrame(rows)


def rung_settings(g: pd.DataFrame) -> Dict[str, str]:
    """rung id -> the settings it ran with (the attack's label, e.g. ``APGD-T-12 (targets 1-9 of 9 ranked ...)``),
    from the units' recorded history; empty for ladders recorded before the history was kept."""
    import json

    out: Dict[str, str] = {}
    if "converge_history" not in g.columns:
        return out
    for js in g["converge_history"].dropna().astype(str).unique():
        try:
            for h in json.loads(js):
                out.setdefault(str(h.get("id", "")), str(h.get("settings", "")))
        except (ValueError, TypeError, AttributeError):
            continue
    return out


@summarizers.register("converge")
def converge_rows(records: pd.DataFrame, ce_baseline: Optional[str] = None) -> pd.DataFrame:
    """The tidy rows above, one set per condition."""
    if records.empty:
        return pd.DataFrame()
    acc = accuracy_rows(records, ("attack", "eps"), metrics=("top1",))
    ident = [c for c in acc.columns if c not in ("metric", "value", "n", "ci_low", "ci_high")]
    out = []
    keys = [c for c in ID_COLUMNS if c in records.columns] + ["eps", "settings_id"]
    for _, g in records.groupby(keys, sort=False, dropna=False):
        base_row = acc[(acc["eps"] == g["eps"].iloc[0]) & (acc["settings_id"] == g["settings_id"].iloc[0])
                       & (acc["run_id"] == g["run_id"].iloc[0] if "run_id" in acc.columns else True)]
        base = base_row.iloc[0][ident].to_dict()
        status, detail = condition_verdict(g)
        c = curve(g)
        rows = [{**base, "metric": "rung_top1", "condition": r["rung"], **r} for r in c.to_dict("records")]
        conv = float(base_row.iloc[0]["value"])
        n = len(g)
        rung0 = 100.0 * float((g["rung0_correct_top1"].astype(bool)).sum()) / n
        rows.append({**base, "metric": "converge_gap", "value": rung0 - conv, "n": n})
        for kind in ("forward", "backward"):
            rows.append({**base, "metric": f"converge_passes_{kind}", "value": float(g[f"passes_{kind}"].mean()), "n": n})
        part = pd.concat([base_row, pd.DataFrame(rows)], ignore_index=True)
        part["status"], part["status_detail"] = status, detail
        out.append(part)
    return concat_rows(out)


def format_converge(summary: pd.DataFrame) -> str:
    """One table per condition (robust accuracy after each rung, cumulative passes) and its status line."""
    if summary.empty or "benchmark" not in summary.columns:
        return ""
    rows = summary[summary["benchmark"] == "converge"]
    if rows.empty:
        return ""
    from ...core.labels import eps_text

    parts = []
    keys = [c for c in ("model", "eps", "settings_id") if c in rows.columns]
    for _, g in rows.groupby(keys, sort=False):
        top = g[g["metric"] == "top1"].iloc[0]
        c = g[g["metric"] == "rung_top1"].copy()
        table = pd.DataFrame({"rung": c["rung_label"], "robust top-1 %": c["value"].map(lambda v: f"{v:6.2f}"),
                              "95% CI": [f"[{lo:5.1f}, {hi:5.1f}]" for lo, hi in zip(c["ci_low"], c["ci_high"])],
                              "fwd/sample": c["passes_forward_cum"].map(lambda v: f"{v:8.1f}"),
                              "bwd/sample": c["passes_backward_cum"].map(lambda v: f"{v:8.1f}")})
        if "rung_settings" in c.columns and c["rung_settings"].fillna("").astype(str).str.len().any():
            table["settings"] = c["rung_settings"].fillna("").astype(str).to_list()
        gap = g[g["metric"] == "converge_gap"]["value"]
        status = str(top["status"])
        why = status.split(": ", 1)[1] if status.startswith("upper bound: ") else status
        if status == CONVERGED:
            what = "converged robust top-1"
        elif status.startswith(REDUCED):
            what = "robust top-1 of a reduced ladder (settings below the defaults), an upper bound:"
        else:
            what = f"robust top-1, an upper bound ({why}):"
        norm = str(top.get("norm") or "linf")
        head = (f"converge: {top.get('model', '')} eps {eps_text(float(top['eps']), norm)} "
                f"(n={int(top['n'])}): {what} {top['value']:.2f}% [{top['ci_low']:.1f}, {top['ci_high']:.1f}]")
        line = f"status: {status}: {top['status_detail']}"
        if len(gap) and np.isfinite(gap.iloc[0]):
            line += (f"; your attack's number is {gap.iloc[0]:.2f} pt above the "
                     f"{'converged one' if status == CONVERGED else 'ladder' + chr(39) + 's'}")
        parts.append("\n".join([head, table.to_string(index=False), line]))
    return "\n\n".join(parts)
