"""The report's "Evidence that each attack worked" section: the condition x indicator matrix."""
from __future__ import annotations

import html

import pandas as pd

from .evidence_text import SHORT, evidence_matrix
from .indicators import INDICATORS


def evidence_section(rows: pd.DataFrame) -> str:
    """HTML: the matrix of passes per attacked sample, indicator shares and agreement, with its notes
    (empty when the results carry no attack telemetry)."""
    wide, notes = evidence_matrix(rows if rows is not None else pd.DataFrame())
    if wide.empty:
        return ""
    shown = [c for c in wide.columns if c in [SHORT[i] for i in INDICATORS]]
    flagged = ("percent of attacked samples flagged by each indicator of attack failure shown" if shown else
               "no indicator of attack failure applies to these attacks without an extra run")
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in wide.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
                   for row in wide.itertuples(index=False))
    items = "".join(f"<li>{'' if n.startswith('warning') or ': warning' in n else f'n/a{i + 1}: '}"
                    f"{html.escape(n)}</li>" for i, n in enumerate(notes))
    return ("<h2 id='evidence'>Evidence that each attack worked</h2>"
            f"<p class='muted'>Passes per attacked sample; {flagged} (Pintor et al., NeurIPS 2022; definitions and "
            "thresholds in docs/attacks.md); verdict agreement with fp32 eager.</p>"
            f"<div style='overflow-x:auto'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
            + (f"<ul class='notes'>{items}</ul>" if items else ""))


def converge_section(rows: pd.DataFrame) -> str:
    """HTML: per ``--converge`` condition, the converged value, its status and the convergence curve
    (empty when the results hold no ladder rows); the curve's plot is in the Plots section."""
    from ..summaries.converge import format_converge

    text = format_converge(rows if rows is not None else pd.DataFrame())
    if not text:
        return ""
    return ("<h2 id='converge'>Converged robust accuracy</h2>"
            "<p class='muted'>Per eps, a ladder of attacks each run only on the samples still robust (your attack, "
            "then rounds of ranked APGD-T, APGD-CE, FAB-T and Square, with EOT / SPSA where the evidence calls for "
            "them) until a round breaks at most the stated tolerance; the status says whether the number converged or is "
            "only an upper bound (docs/attacks.md).</p>"
            f"<pre>{html.escape(text)}</pre>")
