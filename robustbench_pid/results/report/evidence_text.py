"""The condition x indicator matrix (plus passes and agreement), from tidy rows, for the terminal
and the HTML report (``evidence_report``). Pandas only."""
from __future__ import annotations

from typing import List, Tuple

import pandas as pd

from ...core.labels import eps_text
from .evidence_rows import EVIDENCE_METRICS
from .indicators import INDICATORS, LIBRARY_ATTACKS

BLIND = ("silent_success", "incomplete_optimization", "unavailable_gradients")  # need the attack's own iterates

SHORT = {"passes_forward": "fwd/sample", "passes_backward": "bwd/sample", "silent_success": "silent",
         "incomplete_optimization": "incomplete", "unconstrained_failure": "unconstrained",
         "unavailable_gradients": "no-grad", "unstable_predictions": "unstable", "transfer_failure": "transfer",
         "agreement": "agreement"}


def evidence_matrix(summary: pd.DataFrame) -> Tuple[pd.DataFrame, List[str]]:
    """(one row per model and condition, one column per evidence metric; the notes behind n/a cells).

    Indicators are the percent of attacked samples flagged; ``n/a¹`` cells point to a note saying why
    the value could not be computed."""
    if summary.empty or "metric" not in summary.columns:
        return pd.DataFrame(), []
    ev = summary[summary["metric"].isin(EVIDENCE_METRICS)].copy()
    if ev.empty:
        return pd.DataFrame(), []
    norms = ev["norm"].fillna("").astype(str) if "norm" in ev.columns else pd.Series("", index=ev.index)
    cond = ev["condition"].fillna("").astype(str) if "condition" in ev.columns else pd.Series("", index=ev.index)
    label = ev["setting"].astype(str) if "setting" in ev.columns else ev["attack"].astype(str)
    ev["condition "] = [f"{lab} @ {eps_text(e, n)}" + (f" [{c}]" if c else "") for lab, e, n, c in
                        zip(label, ev["eps"], norms, cond)]
    if "run_id" in ev.columns:  # one model's condition from several runs (other samples or protocols): a row each
        runs = ev.groupby(["model", "condition "])["run_id"].transform("nunique")
        ev.loc[runs > 1, "condition "] = ev.loc[runs > 1, "condition "] + " (" + ev.loc[runs > 1, "run_id"].astype(str) + ")"
    notes: List[str] = []
    cells = []
    for _, r in ev.iterrows():
        m = r["metric"]
        if pd.isna(r["value"]):
            note = str(r.get("note", "") or "not computable")
            if note not in notes:
                notes.append(note)
            cells.append(f"n/a{notes.index(note) + 1}")
        elif m.startswith("passes"):
            cells.append(f"{r['value']:.1f}")
        elif m == "agreement":  # the interval says how much a clean sweep of N checks is worth
            cells.append(f"{r['value']:.1f}% [{r['ci_low']:.1f}, {r['ci_high']:.1f}] n={int(r['n'])}")
        else:
            cells.append(f"{r['value']:.1f}%")
            note = r.get("note", "")
            if isinstance(note, str) and note.startswith("warning"):
                notes.append(f"{r['model']} {r['condition ']}: {note}")
    ev["cell"] = cells
    keys = [k for k in ("model", "protocol", "precision", "condition ") if k in ev.columns and
            (k != "protocol" or ev["protocol"].nunique() > 1)]  # the protocol is a column only when it varies
    wide = ev.pivot_table(index=keys, columns="metric", values="cell", aggfunc="first", sort=False)
    cols = [m for m in EVIDENCE_METRICS if m in wide.columns]
    wide = wide[cols].rename(columns=SHORT).reset_index().fillna("-")
    return wide, notes


def format_evidence(summary: pd.DataFrame) -> str:
    """Plain text: the matrix, then the numbered notes (why a cell is n/a, agreement warnings)."""
    wide, notes = evidence_matrix(summary)
    if wide.empty:
        return "evidence: no attack telemetry in these results"
    shown = [SHORT[i] for i in INDICATORS if SHORT[i] in wide.columns]
    ev = summary[summary["metric"].isin(EVIDENCE_METRICS)]
    attacks = set(ev["attack"].astype(str)) if "attack" in ev.columns else set()
    library_only = bool(attacks) and attacks <= set(LIBRARY_ATTACKS)  # their iterates stay unseen: --indicators or not
    others = [SHORT[i] for i in INDICATORS if SHORT[i] not in wide.columns and not (library_only and i in BLIND)]
    head = ("evidence that each attack worked: passes per attacked sample" +
            (", and the share of attacked samples flagged by each indicator of attack failure shown ("
             + ", ".join(shown) + "; docs/attacks.md)" if shown else
             "; no indicator of attack failure applies to these attacks without an extra run (docs/attacks.md)") +
            (f"; {', '.join(others)} need --indicators (an extra run per attack)" if others else ""))
    lines = [head, wide.to_string(index=False)]
    lines += [f"  n/a{i + 1}: {n}" if not n.startswith(("warning",)) and ": warning" not in n else f"  {n}"
              for i, n in enumerate(notes)]
    return "\n".join(lines)


OVERESTIMATE = ("incomplete_optimization", "unavailable_gradients")  # flags that say: robust accuracy may be too high


def overestimate_note(summary: pd.DataFrame) -> str:
    """One line when an indicator that costs no extra pass flags attacked samples: the number may be an
    overestimate, and ``--converge`` is the way to a converged one ('' when nothing is flagged)."""
    if summary.empty or "metric" not in summary.columns:
        return ""
    bench = summary["benchmark"].astype(str) if "benchmark" in summary.columns else pd.Series("", index=summary.index)
    rows = summary[summary["metric"].isin(OVERESTIMATE) & (bench != "converge")]
    rows = rows[pd.to_numeric(rows["value"], errors="coerce") > 0]
    if rows.empty:
        return ""
    worst = rows.loc[pd.to_numeric(rows["value"]).idxmax()]
    norm = str(worst.get("norm", "") or "")
    names = {"incomplete_optimization": "incomplete optimisation", "unavailable_gradients": "unavailable gradients"}
    what = (f"{names[str(worst['metric'])]} flags up to {float(worst['value']):.1f}% of the attacked samples "
            f"({worst.get('setting', worst['attack'])} @ {eps_text(float(worst['eps']), norm)})")
    then = _converged_then(summary[(bench == "converge") & (summary["metric"] == "top1")], rows)
    return f"warning: the robust accuracy may be an overestimate in {len(rows)} condition(s): {what}; {then}"


def _converged_then(conv: pd.DataFrame, flagged: pd.DataFrame) -> str:
    """What to report instead of the flagged numbers: the ladder's value where it converged at that model and eps
    (an L-inf condition), and otherwise say that the number is still an upper bound or that no ladder ran."""
    status = "status" in conv.columns
    done, bound, missing = 0, [], 0
    for _, r in flagged.iterrows():
        same = conv[(pd.to_numeric(conv["eps"]) - float(r["eps"])).abs() < 1e-9]
        if "model" in conv.columns and "model" in flagged.columns:
            same = same[same["model"].astype(str) == str(r["model"])]
        if str(r.get("norm", "") or "linf") != "linf" or same.empty:
            missing += 1
        elif status and str(same["status"].iloc[0]) != "converged":
            bound.append(str(same["status"].iloc[0]))
        else:
            done += 1
    if not bound and not missing:
        return "the converged values above are the ones to report"
    out = []
    if bound:
        out.append(f"the ladder did not converge for {len(bound)} of them ({', '.join(sorted(set(bound)))}), so "
                   f"its values there are upper bounds too")
    if missing:
        out.append((f"{missing} of them have no converged value: " if done or bound else "") +
                   "run again with --converge for a converged value (L-inf and L2 attacks; docs/attacks.md)")
    return "; ".join(out)
