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

from typing import Any, Dict, List, Optional

import numpy as np
import pandas as pd

from ..stats.metrics import wilson_interval
from . import summarizers
from .accuracy import ID_COLUMNS, accuracy_rows, concat_rows

CONVERGED, NOT_CONVERGED, UPPER_BOUND = "converged", "not converged", "upper bound: gradients unavailable"
BATCH_DEPENDENT = "not converged: outputs depend on the batch"
MISLED = "upper bound: gradients mislead"  # the random search came nearer than the gradient families (design 5)
RANDOM_OUTPUTS = "not converged: outputs are random"  # repeated passes disagree: each verdict is one draw (design 5)
REDUCED = "converged (reduced ladder"  # + ": settings below the defaults)": a weaker ladder says so in its status
STATUSES = (CONVERGED, NOT_CONVERGED, UPPER_BOUND, BATCH_DEPENDENT, MISLED, RANDOM_OUTPUTS)
# The ladder's design revision (benchmarks/ladder/: rung order, rung 0, the probes), part of every
# converge unit's key, so a run folder of another revision is never resumed with this one, and recorded in its
# params, so a result of an earlier design says so (``ladder_design``). What each revision changed: docs/attacks.md,
# "Ladder revisions" (one list, there).
DESIGN = 10
MAX_ROUNDS = 9  # rung ids of later rounds carry "@r"; the order below lists them up to this round
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
RUNG_LABELS.update({rung_id(b, r): f"{RUNG_LABELS[b]}, round {r} (nearest)" for r in range(2, MAX_ROUNDS + 1)
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


NOT_FULL = ("user", "strong-flagged", "spsa")  # rungs that attack a subset (or are rung 0): not the stop rule's


def _units(g: pd.DataFrame) -> pd.DataFrame:
    return g.drop_duplicates("unit") if "unit" in g.columns else g.head(1)


def condition_tolerance(g: pd.DataFrame) -> Optional[int]:
    """The ladder's tolerance for the whole condition (as if it were one work unit), from its recorded settings;
    None for records that do not carry them."""
    import json
    import math

    try:
        lad = json.loads(str(g["params"].iloc[0]))["ladder"]
        return max(int(lad["tol_min"]), int(math.floor(float(lad["tol_share"]) * len(g) + 1e-9)))
    except (KeyError, ValueError, TypeError, IndexError):
        return None


def last_full_breaks(g: pd.DataFrame) -> int:
    """Samples the last full round of each work unit still broke (continuation rounds, which run only the families
    still closing in, are judged by exhaustion instead; ladders recorded before rounds existed: their last
    full rung), summed over the condition's units (0 for a unit with no sample left robust: no further rung
    could break one there)."""
    total = 0
    for _, u in _units(g).iterrows():
        rows = g[g["unit"] == u["unit"]] if "unit" in g.columns else g
        if not rows["correct_top1"].astype(bool).any():
            continue
        ids, broke = str(u["converge_rungs"]).split(","), str(u["converge_broke"]).split(",")
        rounds = str(u.get("converge_rounds", "") if hasattr(u, "get") else "").split(",")
        if len(rounds) == len(ids) and all(r.strip().isdigit() for r in rounds):
            last = max(int(r) for r, i in zip(rounds, ids) if i != "user") if len(ids) > 1 else 0
            full = pd.to_numeric(pd.Series([u.get("converge_full_round", 0)]), errors="coerce").fillna(0).iloc[0]
            if 0 < int(full) < last:  # design 5: continuation rounds after the last full one are judged by exhaustion
                last = int(full)
            total += sum(int(b) for i, b, r in zip(ids, broke, rounds) if i != "user" and int(r) == last)
            continue
        pairs = [(r, int(b)) for r, b in zip(ids, broke) if r and r not in NOT_FULL]
        total += pairs[-1][1] if pairs else 0
    return total


def flagged_robust(g: pd.DataFrame, column: str) -> int:
    """How many of the condition's still-robust samples carry the per-sample flag ``column`` (0 without it)."""
    if column not in g.columns:
        return 0
    return int((g[column].fillna(False).astype(bool) & g["correct_top1"].astype(bool)).sum())


def condition_status(g: pd.DataFrame) -> str:
    """The worst status over a condition's chunks (an upper bound anywhere makes the whole an upper bound, a
    batch-dependent model anywhere makes it batch-dependent), then the stop rule for the whole condition: each work
    unit's ladder stops on its own tolerance, so many small units could each leave a sample to their last round;
    the condition is converged only if its units' last rounds together broke at most the condition's tolerance,
    and an upper bound if more of its robust samples than that had no usable gradients. A reduced ladder's
    ``converged (reduced ladder: ...)`` stays so."""
    got = set(g["converge_status"].astype(str))
    tol = condition_tolerance(g)
    if UPPER_BOUND in got or flagged_robust(g, "grad_unavailable") > (tol if tol is not None else len(g)):
        return UPPER_BOUND
    for status in (BATCH_DEPENDENT, RANDOM_OUTPUTS, MISLED):
        if status in got:
            return status
    if tol is not None and flagged_robust(g, "converge_untrusted") > tol:
        return MISLED
    if tol is not None and flagged_robust(g, "converge_closing") > tol:
        return NOT_CONVERGED
    if len(got) != 1 or not (got <= {CONVERGED} or next(iter(got)).startswith(REDUCED)):
        return NOT_CONVERGED
    if tol is not None and last_full_breaks(g) > tol:
        return NOT_CONVERGED
    return next(iter(got))


def condition_detail(g: pd.DataFrame) -> str:
    """One line on how the condition's status came about (its work units' ladders, summed at condition level)."""
    per_unit = _units(g)
    units = "; ".join(dict.fromkeys(per_unit["converge_detail"].astype(str)))
    tol = condition_tolerance(g)
    if len(per_unit) == 1 or tol is None:
        return units
    for col, what in (("converge_untrusted", "untrusted gradients"), ("converge_closing", "a search still closing in")):
        k = flagged_robust(g, col)
        if k > tol:
            units = f"{k} still-robust samples with {what} over the condition's units (tolerance {tol}); " + units
    st = per_unit["converge_status"].astype(str)
    ok = int((st == CONVERGED).sum() + st.str.startswith(REDUCED).sum())
    return (f"{ok} of {len(per_unit)} work units converged; their last rounds broke {last_full_breaks(g)} of "
            f"{len(g)} samples (tolerance {tol} for the condition); per unit: {units}")


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
        status, detail = condition_status(g), condition_detail(g)
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
