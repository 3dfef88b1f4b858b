"""Rendering tables for people: string cells with their notes, as Markdown, LaTeX, CSV or HTML.

Markdown/LaTeX/CSV are written here (a few lines) rather than through pandas' ``to_markdown``
(needs ``tabulate``) or ``to_latex`` (needs ``jinja2``): exact, dependency-free text that the
tests compare verbatim.
"""
from __future__ import annotations

import html
import textwrap
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

import pandas as pd

from ...errors import UserError

FORMATS = ("markdown", "latex", "csv")
MISSING = "-"
WIDTH = 200  # the widest line `table` prints by default: wider tables continue below, repeating their key columns


# ----------------------------------------------------------------------------------------------
# cell formatting
def fmt_value(v: float, lo: float = float("nan"), hi: float = float("nan")) -> str:
    if v is None or pd.isna(v):
        return MISSING
    if lo is None or hi is None or pd.isna(lo) or pd.isna(hi):
        return f"{v:.2f}"
    return f"{v:.2f} [{lo:.1f}, {hi:.1f}]"


def fmt_delta(d: Optional[float]) -> str:
    return MISSING if d is None or pd.isna(d) else f"{d:+.2f}"


def fmt_p(p: Optional[float], alpha: float = 0.05, floor: float = 0.0) -> str:
    """``floor``: the resolution of a bootstrap p-value (1/resamples): at the floor it reads "≤floor"."""
    if p is None or pd.isna(p):
        return "n/a"
    if floor and p <= floor:
        s = f"≤{floor:.3g}"
    else:
        s = "<0.001" if p < 0.001 else f"{p:.3f}"
    return s + (" *" if p < alpha else "")



@dataclass
class Table:
    """A rendered table: string cells plus the notes that explain them."""

    frame: pd.DataFrame
    title: str = ""
    notes: List[str] = field(default_factory=list)
    keys: int = 2  # leading columns that name a row (Attack, Metric): repeated in each part of a wrapped table
    glued: Tuple[int, ...] = ()  # columns kept in the same part as the column before them (a Δ's p)

    def to_markdown(self) -> str:
        return render_markdown([self])

    def to_latex(self) -> str:
        return render_latex([self])

    def to_csv(self) -> str:
        return render_csv([self])

    def __str__(self) -> str:
        return self.to_markdown()

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def _repr_html_(self) -> str:
        return render_html([self])


def one_line(s: Any) -> str:
    """``s`` on one line: a line break inside a cell (a label, a model's name) would end a table row there."""
    return " ".join(str(s).splitlines()) if any(c in str(s) for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029") \
        else str(s)


def md_cell(s: Any) -> str:
    """A Markdown table cell: one line, with its pipes escaped (both would split the row into other cells)."""
    return one_line(s).replace("|", "\\|")


_md_escape = md_cell


def render_markdown(tables: Sequence[Table], width: Optional[int] = None) -> str:
    """Markdown; with ``width``, a table whose lines would be wider continues below in parts (each repeating the
    key columns, and saying which columns it holds), and notes wrap."""
    parts: List[str] = []
    for t in tables:
        lines: List[str] = []
        if t.title:
            lines += [f"### {one_line(t.title)}", ""]
        grid = [[_md_escape(c) for c in t.frame.columns]] + \
            [[_md_escape(v) for v in row] for row in t.frame.astype(str).itertuples(index=False)]
        groups = column_groups(grid, t.keys, width, t.glued)
        for k, cols in enumerate(groups):
            if len(groups) > 1:
                lo, hi, n = cols[t.keys] - t.keys + 1, cols[-1] - t.keys + 1, len(grid[0]) - t.keys
                lines += ([""] if k else []) + [f"(columns {lo}-{hi} of {n}" + ("; continued below)" if k < len(groups) - 1
                                                                                 else ")"), ""]
            head = [grid[0][i] for i in cols]
            lines.append("| " + " | ".join(head) + " |")
            lines.append("|" + "|".join("---" for _ in head) + "|")
            lines += ["| " + " | ".join(row[i] for i in cols) + " |" for row in grid[1:]]
        if t.notes:
            lines += ["", "Notes:"] + [ln for n in t.notes for ln in wrap_line(f"- {n}", width, "  ")]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def column_groups(grid: Sequence[Sequence[str]], keys: int, width: Optional[int],
                  glued: Sequence[int] = ()) -> List[List[int]]:
    """Column indices of each part of a Markdown table no line of which is wider than ``width`` (None or 0: one
    part): the ``keys`` leading columns in every part, the others in order, as many per part as fit (at least one);
    a ``glued`` column stays with the column before it."""
    n = len(grid[0]) if grid else 0
    key_cols = list(range(min(keys, n)))
    if not width or n <= len(key_cols):
        return [list(range(n))]
    wide = [max(len(row[i]) for row in grid) + 3 for i in range(n)]  # "| " + cell + " " per column
    base = 1 + sum(wide[i] for i in key_cols)
    if base + sum(wide[len(key_cols):]) <= width:
        return [list(range(n))]
    groups: List[List[int]] = []
    cur: List[int] = []
    used = base
    units: List[List[int]] = []
    for i in range(len(key_cols), n):
        if i in glued and units:
            units[-1].append(i)
        else:
            units.append([i])
    for unit in units:
        need = sum(wide[i] for i in unit)
        if cur and used + need > width:
            groups.append(key_cols + cur)
            cur, used = [], base
        cur += unit
        used += need
    groups.append(key_cols + cur)
    return groups


def wrap_line(text: str, width: Optional[int], indent: str = "  ") -> List[str]:
    """``text`` as lines no wider than ``width`` (continuations indented; a word longer than that stays whole)."""
    if not width or len(text) <= width:
        return [text]
    return textwrap.wrap(text, width=width, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False) or [text]


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _tex(s: Any) -> str:
    out = "".join(_LATEX_SPECIAL.get(ch, ch) for ch in one_line(s))  # a blank line would end the tabular
    return (out.replace("↓", r"$\downarrow$").replace("≤", r"$\leq$").replace("Δ", r"$\Delta$").replace("−", "-")
            .replace("<0.001", r"$<$0.001"))


def render_latex(tables: Sequence[Table]) -> str:
    parts: List[str] = []
    for t in tables:
        cols = list(t.frame.columns)
        lines = [f"% {t.title}" if t.title else "%", r"\begin{tabular}{" + "l" * 2 + "r" * (len(cols) - 2) + "}",
                 r"\hline", " & ".join(_tex(c) for c in cols) + r" \\", r"\hline"]
        for _, r in t.frame.iterrows():
            lines.append(" & ".join(_tex(r[c]) for c in cols) + r" \\")
        lines += [r"\hline", r"\end{tabular}"]
        lines += [f"% {_tex(n)}" for n in t.notes]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def render_csv(tables: Sequence[Table]) -> str:
    frames = []
    for t in tables:
        f = t.frame.copy()
        if len(tables) > 1 or t.title:
            f.insert(0, "table", t.title)
        frames.append(f)
    return pd.concat(frames, ignore_index=True).to_csv(index=False)


def render_html(tables: Sequence[Table]) -> str:
    parts = []
    for t in tables:
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in t.frame.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r[c]))}</td>" for c in t.frame.columns) + "</tr>"
                       for _, r in t.frame.iterrows())
        notes = ("<ul class='notes'>" + "".join(f"<li>{html.escape(n)}</li>" for n in t.notes) + "</ul>"
                 if t.notes else "")
        title = f"<h3>{html.escape(t.title)}</h3>" if t.title else ""
        parts.append(f"{title}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes}")
    return "\n".join(parts)


def render(tables: Sequence[Table], fmt: str = "markdown", width: Optional[int] = None) -> str:
    """The tables as text; ``width`` (Markdown only): no line wider, the table continuing below in parts."""
    if fmt not in FORMATS:
        raise UserError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")
    if width is not None and (isinstance(width, bool) or not isinstance(width, int) or width < 0 or 0 < width < 40):
        raise UserError(f"--width {width!r}: give a line width of at least 40 characters, or 0 for no wrapping")
    if fmt == "markdown":
        return render_markdown(tables, width)
    return {"latex": render_latex, "csv": render_csv}[fmt](tables)

