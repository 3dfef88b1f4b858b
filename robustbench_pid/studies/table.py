"""A study folder's table with the paper beside it (torch-free: reads files only).

A study folder (``reproduce --out DIR``) holds ``study.toml`` (the study as it ran) and one entry
per (model, published column) it was compared with, ``<model>@<column>/entry.json``, whose row run
folders are ``<protocol>/<row>/`` (ordinary run folders). The table has the paper's rows and
metrics in the paper's order and, per entry and protocol, the published value, this run's value
with its 95% interval and n, the difference, and a mark where the published value lies outside
the interval. Written as table.md / table.csv / table.tex beside the runs.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pandas as pd

from ..results.files.verify import is_complete
from ..results.tables.render import WIDTH, column_groups, md_cell, one_line, wrap_line
from ..results.summaries.converge import CONVERGED
from .folder import ENTRY_FILE, STUDY_FILE, checked_folder, entries  # noqa: F401 (names readers use)
from .spec import CONVERGED_DIR, METRICS, Row, Study, attack_settings

MARK = "*"
# published values are printed to 2 decimals: one within half a unit of the last digit of an interval's end is inside
ROUNDING = 0.005 + 1e-9
CSV_COLUMNS = ["study", "row", "label", "metric", "column", "model", "protocol", "paper", "value", "ci_low",
               "ci_high", "n", "diff", "outside", "status"]


@dataclass
class Cell:
    row: str
    label: str
    metric: str
    column: str
    model: str
    protocol: str
    paper: Optional[float]
    value: Optional[float]
    ci_low: Optional[float]
    ci_high: Optional[float]
    n: Optional[int]
    status: str = ""  # the ladder's status for a converged cell: anything but "converged" is an upper bound

    @property
    def converged(self) -> bool:
        return self.protocol.startswith("converged")

    @property
    def diff(self) -> Optional[float]:
        # a converged value is the standard protocol's worst case in pixel units: another threat model than the
        # published paper-protocol number beside it, so no difference or interval test against it
        if self.paper is None or self.value is None or self.converged:
            return None
        d = self.value - self.paper
        return 0.0 if abs(d) < ROUNDING else d

    @property
    def outside(self) -> Optional[bool]:
        if self.paper is None or self.ci_low is None or self.ci_high is None or self.converged:
            return None
        return not (self.ci_low - ROUNDING <= self.paper <= self.ci_high + ROUNDING)


def is_study_folder(path: Path) -> bool:
    return (Path(path) / STUDY_FILE).is_file()


def _num(v: Any) -> Optional[float]:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def pick(summary: pd.DataFrame, row: Row, metric: str, converged: bool = False) -> Optional[pd.Series]:
    """The summary line that is ``metric`` of ``row`` (its attack at its eps, or the clean pass);
    ``converged``: the ``--converge`` value at the row's eps instead (top-1 only)."""
    if converged:
        eps = attack_settings(row).get("eps") if row.attack is not None else None
        if eps is None or metric != "top1" or "benchmark" not in summary.columns:
            return None
        sub = summary[(summary["benchmark"] == "converge") & (summary["metric"] == "top1")]
        sub = sub[(sub["eps"].astype(float) - eps).abs() <= 1e-6 * max(1.0, eps)]
        return None if sub.empty else sub.iloc[0]
    derived = {"corrupted_top1": ("mean_err", lambda v: 100.0 - v), "params_m": ("params", lambda v: v / 1e6),
               "gmac_per_sample": ("macs_per_sample", lambda v: v / 1e9)}
    if metric in derived:
        source, fn = derived[metric]
        m = pick(summary, row, source)
        if m is None:
            return None
        m = m.copy()
        m["value"], m["ci_low"], m["ci_high"] = fn(float(m["value"])), float("nan"), float("nan")
        return m
    sub = summary[summary["metric"] == metric]
    bench = sub["benchmark"] if "benchmark" in sub else pd.Series("", index=sub.index)
    if row.attack is not None:
        sub = sub[sub["attack"] == row.attack["name"]]
        eps = attack_settings(row).get("eps")
        if eps is not None:
            sub = sub[(sub["eps"].astype(float) - eps).abs() <= 1e-6 * max(1.0, eps)]
    elif (bench == "adversarial").any():
        sub = sub[sub["attack"] == "clean"]
    return None if sub.empty else sub.iloc[0]


BOOTSTRAPPED = {"mce", "relative_mce", "aupr"}  # the summary gives them no interval; the records do


def with_bootstrap_interval(line: pd.Series, run_dir: Path, n_boot: int = 1000) -> pd.Series:
    """``line`` with the 95% bootstrap interval of its mCE / AUPR over the run's images (as ``table`` shows)."""
    from ..results.tables.comparisons import interval_from_records

    line = line.copy()
    line["ci_low"], line["ci_high"] = interval_from_records(line, pd.read_parquet(run_dir / "records.parquet"),
                                                            n_boot=n_boot)
    return line


def study_cells(out: Path) -> Tuple[Study, List[Cell], List[str]]:
    """The study of folder ``out``, a cell per (row, metric, entry, protocol) and notes (missing rows)."""
    out = Path(out)
    study, found = checked_folder(out)  # the copy, the entries and their runs checked against each other
    cells: List[Cell] = []
    notes: List[str] = []
    not_run: Dict[str, List[str]] = {}  # who (entry, protocol) -> rows without a finished run
    no_converged: Dict[str, List[str]] = {}
    started: set = set()  # rows some entry was asked for (finished or not)
    for e in found:
        # the protocol folders first, the converged runs beside them last (they are read against them)
        protocols = sorted((p.name for p in e["dir"].iterdir() if p.is_dir()), key=lambda n: (n == CONVERGED_DIR, n))
        for proto in protocols:
            for r in study.rows:
                run_dir = e["dir"] / proto / r.name
                summary = pd.read_csv(run_dir / "summary.csv") if is_complete(run_dir) else None
                converged = proto == CONVERGED_DIR  # reproduce --converge: standard-protocol converged runs
                if run_dir.is_dir() and not converged:  # a row's folder exists from its first unit on
                    started.add(r.name)
                if summary is None:
                    who = f"{e['model']} as {e['column']!r}" + ("" if converged else f", {proto} protocol")
                    (no_converged if converged else not_run).setdefault(who, []).append(r.name)
                for m in r.metrics:
                    line = pick(summary, r, m, converged) if summary is not None else None
                    if line is not None and m in BOOTSTRAPPED and _num(line["ci_low"]) is None:
                        line = with_bootstrap_interval(line, run_dir)
                    paper = (r.published or {}).get(e["column"], {}).get(m)
                    n = _num(line["n"]) if line is not None else None
                    status = str(line.get("status", "") or "") if converged and line is not None else ""
                    if status and status != CONVERGED:
                        notes.append(f"{e['model']} as {e['column']!r}: row {r.name!r}: the ladder's status is "
                                     f"{status!r} ({line.get('status_detail', '')}), so its converged-column value "
                                     f"is only an upper bound")
                    cells.append(Cell(r.name, r.label, m, e["column"], e["model"],
                                      "converged, standard" if converged else proto, paper,
                                      _num(line["value"]) if line is not None else None,
                                      _num(line["ci_low"]) if line is not None else None,
                                      _num(line["ci_high"]) if line is not None else None,
                                      int(n) if n is not None else None, status))
    return study, cells, missing_notes(study, not_run, no_converged, started) + notes


def missing_notes(study: Study, not_run: Dict[str, List[str]], no_converged: Dict[str, List[str]],
                  started: set) -> List[str]:
    """Rows without a finished run, in a few lines: the rows no entry was asked for (left out with --only/--skip, or
    not run yet) in one line for the whole study, then the rows some entry lacks that were asked for (news), one line
    per set of entries lacking the same rows."""
    everywhere = [r.name for r in study.rows if r.name not in started] if started else []
    notes = [f"not run (left out with --only/--skip, or not run yet; not in the table above): "
             f"{', '.join(everywhere)}"] if everywhere else []
    lacking: Dict[Tuple[str, ...], List[str]] = {}
    for who, rows in not_run.items():
        rest = tuple(r for r in rows if r not in everywhere)
        if rest:
            lacking.setdefault(rest, []).append(who)
    notes += [f"{'; '.join(who)}: row(s) {', '.join(rows)} not run (or not finished)" for rows, who in lacking.items()]
    common = set.intersection(*(set(v) for v in no_converged.values())) if no_converged else set()
    if common:
        notes.append(f"no converged value (L-inf attack rows only, as reproduce --converge names them) in any of "
                     f"{len(no_converged)} entries: rows {', '.join(r.name for r in study.rows if r.name in common)}")
    for who, rows in no_converged.items():
        rest = [r for r in rows if r not in common]
        if rest:
            notes.append(f"{who}: no converged value for row(s) {', '.join(rest)}")
    return notes


def _f(v: Optional[float], signed: bool = False) -> str:
    """2 decimals (percentages, mCE, AUPR); 3 significant digits below 1 (seconds per sample)."""
    if v is None:
        return "—"
    spec = ".2f" if v == 0 or abs(v) >= 1 else ".3g"
    return format(v, ("+" if signed else "") + spec)


def _run_text(c: Cell, with_n: bool = True) -> str:
    if c.value is None:
        return "—"
    ci = f" [{_f(c.ci_low)}, {_f(c.ci_high)}]" if c.ci_low is not None and c.ci_high is not None else ""
    status = c.status if c.status.startswith("upper bound") else f"upper bound: {c.status}"
    bound = f" ({status})" if c.status and c.status != CONVERGED else ""
    return (f"{_f(c.value)}{ci} n={c.n}" if c.n is not None and with_n else f"{_f(c.value)}{ci}") + bound


def one_n(cells: List[Cell]) -> Optional[int]:
    """The sample count of every measured cell when they all share one (then cells need not repeat it)."""
    ns = {c.n for c in cells if c.value is not None}
    return next(iter(ns)) if len(ns) == 1 and None not in ns else None


def shown_rows(study: Study, cells: List[Cell]) -> List[Row]:
    """The rows with a value somewhere (a study run with --only shows those, not a grid of dashes)."""
    have = {c.row for c in cells if c.value is not None}
    return [r for r in study.rows if r.name in have] or list(study.rows)


def _groups(cells: List[Cell], study: Study) -> List[Tuple[str, str, str]]:
    """(column, model, protocol) groups in the study's column order, then the order their entries were first run
    (entries run within one second would otherwise come in folder-name order)."""
    found = list(dict.fromkeys((c.column, c.model, c.protocol) for c in cells))
    order = {c.name: i for i, c in enumerate(study.columns)}
    return sorted(found, key=lambda g: order.get(g[0], len(order)))


def _grid(study: Study, cells: List[Cell], compact: bool = False) -> Tuple[List[str], List[List[str]]]:
    """Header and body. ``compact`` (the Markdown people read): only the rows that ran, and a group whose column
    has no published value shows this run's value alone (no empty paper / diff columns); n in the legend when
    every cell shares it."""
    groups = _groups(cells, study)
    by = {(c.row, c.metric, c.column, c.model, c.protocol): c for c in cells}
    published = {g for g in groups if any(c.paper is not None for c in cells if (c.column, c.model, c.protocol) == g)}
    full = {g for g in groups if not compact or g in published}
    with_n = not compact or one_n(cells) is None
    header = ["", "metric"]
    for g in groups:
        who = f"{g[0]} ({g[1]}, {g[2]})"
        run = "this run (95% CI" + (", n)" if with_n else ")")
        header += [f"{who}: paper", run, "diff", ""] if g in full else [f"{who}: {run}"]
    body: List[List[str]] = []
    for r in (shown_rows(study, cells) if compact else study.rows):
        for i, m in enumerate(r.metrics):
            line = [r.label if i == 0 else "", METRICS[m]]
            for g in groups:
                c = by.get((r.name, m) + g)
                if c is None:
                    line += ["—", "—", "—", ""] if g in full else ["—"]
                elif g in full:
                    line += [_f(c.paper), _run_text(c, with_n), _f(c.diff, signed=True), MARK if c.outside else ""]
                else:
                    line += [_run_text(c, with_n)]
            body.append(line)
    return header, body


def _legend(study: Study, cells: List[Cell]) -> str:
    notes = "".join(f" {r.label}: {r.note}" for r in study.rows if r.note)
    conv = (" Converged columns: the standard protocol's per-sample worst case over the --converge ladder at the "
            "row's eps in pixel units, a larger ball than the paper protocol's eps on the normalised tensor: the "
            "published value is shown beside it, with no difference or " + MARK + " (another threat model)."
            if any(c.converged for c in cells) else "")
    if not any(c.paper is not None for c in cells):  # no paper column, no mark: nothing to explain about them
        return f"Source: {study.source}. No row has a published value.{conv}{notes}"
    unpublished = any(c.paper is None and c.value is not None for c in cells)  # a shown cell with no paper value
    return (f"{MARK}: the published value lies outside this run's 95% interval. Source: {study.source}."
            f"{' Rows without a published value: the paper prints none.' if unpublished else ''}{conv}{notes}")


def render_markdown(study: Study, cells: List[Cell], notes: List[str], width: Optional[int] = WIDTH) -> str:
    """The table people read: the rows that ran, no line wider than ``width`` (a wider table continues below in
    parts, each with the row names), then the legend and the notes (rows not run: one line). Many columns and few
    rows (``--all-columns --only clean``: 13 models, one row) read better turned: a line per column, so of the two
    layouts the one with fewer lines is printed (the usual one on a tie, and whenever a published value is shown)."""
    header, body = _grid(study, cells, compact=True)
    lines = _md_table([header] + body, 2, width, glued_columns(header))
    turned = _turned(study, cells)
    if turned is not None:
        other = _md_table(turned, 1, width, ())
        lines = other if len(other) < len(lines) else lines
    n = one_n(cells)
    legend = _legend(study, cells) + (f" Every value is on n = {n} samples." if n is not None and
                                      "(95% CI)" in " ".join(header) else "")
    lines = [f"### {one_line(study.title)}"] + lines
    lines += [""] + wrap_line(legend, width, "") + [ln for note in notes for ln in wrap_line(f"- {note}", width)]
    return "\n".join(lines) + "\n"


def _md_table(grid: List[List[str]], keys: int, width: Optional[int], glued: Tuple[int, ...]) -> List[str]:
    """Markdown lines of ``grid`` (header first), in parts no wider than ``width`` that repeat the ``keys`` columns."""
    esc = [[md_cell(t) for t in row] for row in grid]  # a | or a line break in a label splits the row
    parts = column_groups(esc, keys, width, glued)
    lines: List[str] = []
    for k, cols in enumerate(parts):
        if len(parts) > 1:
            lines += ["", f"(part {k + 1} of {len(parts)}" + ("; continued below)" if k < len(parts) - 1 else ")")]
        lines += ["", "| " + " | ".join(esc[0][i] for i in cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(r[i] for i in cols) + " |" for r in esc[1:]]
    return lines


def _turned(study: Study, cells: List[Cell]) -> Optional[List[List[str]]]:
    """The compact grid turned (header first): a line per (column, model, protocol), a column per (row, metric) that
    ran. None when a published value is shown: its paper, diff and mark columns belong beside each value."""
    if any(c.paper is not None for c in cells):
        return None
    with_n = one_n(cells) is None
    by = {(c.row, c.metric, c.column, c.model, c.protocol): c for c in cells}
    keys = [(r.name, m, f"{r.label}: {METRICS[m]}") for r in shown_rows(study, cells) for m in r.metrics]
    head = "column (model, protocol): this run (95% CI" + (", n)" if with_n else ")")
    grid = [[head] + [k[2] for k in keys]]
    for g in _groups(cells, study):
        grid.append([f"{g[0]} ({g[1]}, {g[2]})"] +
                    [_run_text(by[k[:2] + g], with_n) if k[:2] + g in by else "—" for k in keys])
    return grid


def glued_columns(header: List[str]) -> Tuple[int, ...]:
    """A published group's run, diff and mark columns stay with its paper column in a wrapped table."""
    return tuple(i for i, h in enumerate(header) if i >= 2 and ": " not in h)


def render_latex(study: Study, cells: List[Cell]) -> str:
    header, body = _grid(study, cells)

    def tex(s: str) -> str:
        for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"),
                     ("↓", r"$\downarrow$"), ("—", "--"), ("*", r"$^*$")):
            s = s.replace(a, b)
        return one_line(s)

    lines = [f"% {one_line(study.title)}", r"\begin{tabular}{" + "l" * len(header) + "}", r"\hline",
             " & ".join(tex(h) for h in header) + r" \\", r"\hline"]
    lines += [" & ".join(tex(t) for t in row) + r" \\" for row in body]
    lines += [r"\hline", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def render_csv(study: Study, cells: List[Cell]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for c in cells:
        w.writerow([study.name, c.row, c.label, c.metric, c.column, c.model, c.protocol,
                    "" if c.paper is None else c.paper, "" if c.value is None else round(c.value, 6),
                    "" if c.ci_low is None else round(c.ci_low, 6), "" if c.ci_high is None else round(c.ci_high, 6),
                    "" if c.n is None else c.n, "" if c.diff is None else round(c.diff, 6),
                    "" if c.outside is None else c.outside, c.status])
    return buf.getvalue()


def render_html(out: Path) -> str:
    """The study table as an HTML section (the report's hook)."""
    import html

    study, cells, notes = study_cells(out)
    header, body = _grid(study, cells)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(t)}</td>" for t in r) + "</tr>" for r in body)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    notes_html = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return (f"<h2>{html.escape(study.title)}</h2><div style='overflow-x:auto'><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{rows}</tbody></table></div><p>{html.escape(_legend(study, cells))}</p><ul>{notes_html}</ul>")


def write_study_table(out: Path) -> str:
    """Write table.md / table.csv / table.tex into study folder ``out``; return the Markdown."""
    from ..results.files.run_files import atomic_write_bytes

    out = Path(out)
    study, cells, notes = study_cells(out)
    md = render_markdown(study, cells, notes)
    for name, text in (("table.md", md), ("table.csv", render_csv(study, cells)),
                       ("table.tex", render_latex(study, cells))):
        atomic_write_bytes(out / name, text.encode(), durable=False)
    from .pairs import write_pairs

    pairs = write_pairs(out, study, entries(out))  # a study with [[pair]] claims: the paired differences too
    return md + ("\n" + pairs if pairs else "")


def drop_study_table(out: Path) -> None:
    """Remove table.md / table.csv / table.tex: a command about to change the rows makes them stale (a run
    re-planned with other settings resets its row), and one killed midway must not leave a table that looks
    finished but disagrees with the rows; the command's end (or ``merge``) writes them again."""
    for name in ("table.md", "table.csv", "table.tex", "pairs.md", "pairs.csv"):
        (Path(out) / name).unlink(missing_ok=True)


def merge_study(out: Path) -> str:
    """``merge STUDY_DIR``: merge every row's run folder (checking it as ``merge RUN_DIR`` does), then the table."""
    from ..results.files.merge import merge

    for plan in sorted(Path(out).glob("*/*/*/plan.json")):
        merge(plan.parent)
    return write_study_table(out)
