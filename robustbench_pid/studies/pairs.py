"""A study's claims, tested: per pair (method vs baseline), row and protocol, the paired difference.

For each ``[[pair]]`` of a study (``study.py``), each row, and each evaluation folder both columns
have (``<entry>/<protocol>/<row>/``: ``paper``, ``standard``, or any further variant a study command
writes beside them, such as a converged evaluation), the per-sample top-1 verdicts of the two models
are paired by ``sample_id`` and give: both accuracies, the difference (method - baseline, in points),
McNemar's exact p-value and the 95% interval of the paired difference (Bonett-Price). Only the images
both runs scored enter (``n``). Torch-free: reads the run folders' ``records.parquet``.

Hook for converged evaluations: a command that writes run folders under ``<entry>/<variant>/<row>/``
(for example ``converged``) needs nothing here: every variant folder present for both columns of a
pair becomes its own group of lines, ordered after the study's protocol.
"""
from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pandas as pd

from ..results.files.verify import is_complete
from .spec import CONVERGED_DIR, Pair, Row, Study, attack_settings
from ..results.stats.stats import mcnemar_from_counts, paired_difference_interval
from ..results.tables.render import WIDTH, md_cell, one_line, wrap_line

PAIRS_MD, PAIRS_CSV = "pairs.md", "pairs.csv"
ALPHA = 0.05


@dataclass(frozen=True)
class PairCell:
    claim: str
    source: str
    baseline: str
    method: str
    row: str
    label: str
    protocol: str
    n: int
    baseline_top1: float
    method_top1: float
    diff: float  # method - baseline, points
    ci_low: float
    ci_high: float
    only_baseline: int  # images the baseline gets right and the method wrong
    only_method: int
    pvalue: float

    @property
    def verdict(self) -> str:
        """'gain' / 'loss' where McNemar rejects equality at 5%, else 'no difference'."""
        if self.pvalue >= ALPHA:
            return "no difference"
        return "gain" if self.diff > 0 else "loss"


def row_verdicts(run_dir: Path, row: Row, converged: bool = False) -> Optional[pd.Series]:
    """Per-sample top-1 correctness (index: sample_id) of ``row`` in one run folder, or None if not run.
    ``converged`` (a ``reproduce --converge`` folder): the ladder's worst case over every rung at the row's
    eps, not the row's own attack, which that folder also holds (rung 0, standard protocol)."""
    if not is_complete(run_dir) or not (run_dir / "records.parquet").is_file():
        return None
    rec = pd.read_parquet(run_dir / "records.parquet", columns=["sample_id", "attack", "eps", "correct_top1"])
    if row.attack is None:
        rec = rec[rec["attack"] == "clean"]
    else:
        rec = rec[rec["attack"] == ("converge" if converged else row.attack["name"])]
        eps = attack_settings(row).get("eps")
        if eps is not None:
            rec = rec[(rec["eps"].astype(float) - eps).abs() <= 1e-6 * max(1.0, eps)]
    if rec.empty:
        return None
    # a missing verdict is no evidence of robustness (astype(bool) would read NaN as correct)
    return rec.drop_duplicates("sample_id").set_index("sample_id")["correct_top1"].astype("boolean").fillna(False) \
        .astype(bool)


def _entry_dirs(entries: List[Dict[str, Any]], study: Study) -> Dict[str, Path]:
    """Column name -> its entry folder (the entry run with the column's own model when several share it)."""
    found: Dict[str, Path] = {}
    for e in entries:
        col = e.get("column")
        if col is None:
            continue
        own = next((c.model for c in study.columns if c.name == col), None)
        if col not in found or e.get("model") == own:
            found[col] = e["dir"]
    return found


def _protocols(a: Path, b: Path, first: str) -> List[str]:
    both = {p.name for p in a.iterdir() if p.is_dir()} & {p.name for p in b.iterdir() if p.is_dir()}
    return sorted(both, key=lambda p: (p != first, p))


@dataclass(frozen=True)
class Gap:
    """A row of a claim without a paired value: the columns that have no finished run of it (one protocol)."""
    claim: str
    protocol: str
    row: str
    columns: Tuple[str, ...]


def pair_results(out: Path, study: Study, entries: List[Dict[str, Any]]
                 ) -> Tuple[List[PairCell], List[Gap], List[str]]:
    """Every (pair, protocol, row) both columns have; the gaps: rows of a claim that one of its columns was asked for
    (it has the row's run folder) but that have no paired value (news); and other notes. A row neither column was
    asked for is no gap: the study table names the rows left out once, for the whole study."""
    dirs = _entry_dirs(entries, study)
    cells: List[PairCell] = []
    gaps: List[Gap] = []
    notes: List[str] = []
    for p in study.pairs:
        missing = [c for c in (p.baseline, p.method) if c not in dirs]
        if missing:
            notes.append(f"{p.claim}: column(s) {', '.join(map(repr, missing))} not run")
            continue
        for proto in _protocols(dirs[p.baseline], dirs[p.method], study.protocol):
            for r in study.rows:
                conv = proto == CONVERGED_DIR
                a = row_verdicts(dirs[p.baseline] / proto / r.name, r, conv)
                b = row_verdicts(dirs[p.method] / proto / r.name, r, conv)
                if a is None or b is None:
                    if any((dirs[c] / proto / r.name).is_dir() for c in (p.baseline, p.method)):
                        gaps.append(Gap(p.claim, proto, r.name, tuple(c for c, v in ((p.baseline, a), (p.method, b))
                                                                      if v is None)))
                    continue
                if not a.index.intersection(b.index).size:
                    notes.append(f"{p.claim}, {proto} protocol, row {r.name!r}: the two columns' runs share no "
                                 f"samples (another --limit/--subset?), so there is nothing to pair")
                    continue
                cells.append(_cell(p, r, proto, a, b))
    return cells, gaps, notes


def gap_notes(gaps: List[Gap]) -> List[str]:
    """One line per claim whose rows did not all run, naming the missing rows and columns together."""
    by: Dict[str, Dict[Tuple[str, Tuple[str, ...]], List[str]]] = {}
    for g in gaps:
        by.setdefault(g.claim, {}).setdefault((g.protocol, g.columns), []).append(g.row)
    return [f"{claim}: no paired value at " + "; ".join(
        f"{proto} protocol row(s) {', '.join(rows)}: not run (or not finished) for {' and '.join(map(repr, cols))}"
        for (proto, cols), rows in parts.items()) for claim, parts in by.items()]


def pair_cells(out: Path, study: Study, entries: List[Dict[str, Any]]) -> Tuple[List[PairCell], List[str]]:
    """Every (pair, protocol, row) both columns have, and notes on what is missing (one line per claim; rows
    neither column was asked for are not named here: the study table names them once).

    ``entries``: the study folder's (model, column) entries (``study_table.entries``), each with its ``dir``."""
    cells, gaps, notes = pair_results(out, study, entries)
    return cells, gap_notes(gaps) + notes


def _cell(p: Pair, r: Row, proto: str, a: pd.Series, b: pd.Series) -> PairCell:
    joined = pd.concat({"a": a, "b": b}, axis=1, join="inner")
    ca, cb = joined["a"].to_numpy(), joined["b"].to_numpy()
    only_a, only_b, n = int((ca & ~cb).sum()), int((~ca & cb).sum()), len(joined)
    test = mcnemar_from_counts(only_a, only_b, n=n)
    lo, hi = paired_difference_interval(only_a, only_b, n)
    return PairCell(p.claim, p.source, p.baseline, p.method, r.name, r.label, proto, n, 100.0 * ca.mean(),
                    100.0 * cb.mean(), test.delta, lo, hi, only_a, only_b, test.pvalue)


def _p(p: float) -> str:
    return "1" if p >= 0.9995 else (f"{p:.3f}" if p >= 0.001 else f"{p:.1e}")


def render_pairs_markdown(study: Study, cells: List[PairCell], notes: List[str],
                          width: Optional[int] = WIDTH) -> str:
    """One table, a line per claim and row (the claim named on its first line), so a study run on one row reads in
    one screen; then the claims' sources and the notes, no line wider than ``width``."""
    attacked = {r.name for r in study.rows if r.attack is not None} & {c.row for c in cells}
    head = ("Difference = method - baseline top-1 (points) on the same images (method: the model the claim says is "
            "more robust); 95% interval of the paired difference (Bonett-Price); p: McNemar's exact test on the images "
            "one model gets right and the other wrong." + (
                " Attack rows are upper bounds on robust accuracy (one attack, the papers' settings); converged rows "
                "are the best upper bound the ladder found, with its status in each run's summary." if attacked else ""))
    lines = [f"### Claims: {one_line(study.title)}", ""] + wrap_line(head, width, "") + [""]
    by_pair: Dict[Tuple[str, str], List[PairCell]] = {}
    for c in cells:
        by_pair.setdefault((c.claim, c.protocol), []).append(c)
    grid = [["claim", "row", "baseline top-1", "method top-1", "difference [95% CI]", "p (McNemar)", "n"]]
    for (claim, proto), group in by_pair.items():
        how = "" if proto == study.protocol else (" (converged)" if proto == CONVERGED_DIR else f" ({proto})")
        for i, c in enumerate(group):
            grid.append([claim + how if i == 0 else "", c.label, f"{c.baseline_top1:.2f}", f"{c.method_top1:.2f}",
                         f"{c.diff:+.2f} [{c.ci_low:+.2f}, {c.ci_high:+.2f}]", _p(c.pvalue), str(c.n)])
    if cells:
        esc = [[md_cell(t) for t in row] for row in grid]
        lines += ["| " + " | ".join(esc[0]) + " |", "|" + "---|" * len(esc[0])]
        lines += ["| " + " | ".join(r) + " |" for r in esc[1:]] + [""]
        sources = dict.fromkeys(f"{c.method} vs {c.baseline}: {c.source}" for c in cells)
        conv = ("; (converged): standard protocol, the per-sample worst case over the --converge ladder started from "
                "the row's attack" if CONVERGED_DIR in {c.protocol for c in cells} else "")
        lines += wrap_line(f"Protocol: {study.protocol}{conv}. Sources: {'; '.join(sources)}.", width, "") + [""]
    lines += [ln for n in notes for ln in wrap_line(f"- {n}", width)]
    return "\n".join(lines).rstrip("\n") + "\n"


def render_pairs_csv(cells: List[PairCell]) -> str:
    buf = io.StringIO()
    names = list(PairCell.__dataclass_fields__) + ["verdict"]
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(names)
    for c in cells:
        d = asdict(c)
        w.writerow([round(d[k], 6) if isinstance(d[k], float) else d[k] for k in names[:-1]] + [c.verdict])
    return buf.getvalue()


def write_pairs(out: Path, study: Study, entries: List[Dict[str, Any]]) -> Optional[str]:
    """Write pairs.md / pairs.csv when the study has pairs; return the Markdown (None without pairs)."""
    from ..results.files.run_files import atomic_write_bytes

    if not study.pairs:
        return None
    cells, notes = pair_cells(out, study, entries)
    md = render_pairs_markdown(study, cells, notes)
    atomic_write_bytes(Path(out) / PAIRS_MD, md.encode(), durable=False)
    atomic_write_bytes(Path(out) / PAIRS_CSV, render_pairs_csv(cells).encode(), durable=False)
    return md


def read_pairs(out: Path) -> pd.DataFrame:
    """A study folder's pair table (``[[pair]]`` claims) as a DataFrame, recomputed from its runs."""
    from .folder import checked_folder

    study, found = checked_folder(Path(out))
    cells, _ = pair_cells(out, study, found)
    return pd.DataFrame([{**asdict(c), "verdict": c.verdict} for c in cells])
