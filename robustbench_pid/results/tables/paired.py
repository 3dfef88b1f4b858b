"""Which model pairs a paper table compares, and their Δ / p cells.

Every pair of 13 models is 78 pairs, 156 columns nobody reads: a table compares the pairs a study defines
(its ``[[pair]]`` claims), each model against a baseline the user names, or, with exactly two models, that
pair; otherwise it shows the models side by side and says how to ask for comparisons. A cell pair measured on
different samples is compared on the samples both have, and the Δ cell says on how many.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import pandas as pd

from ...errors import UserError
from .comparisons import compare_rows
from .render import MISSING, fmt_delta, fmt_p

Pairs = List[Tuple[str, str]]  # (baseline, method): Δ is method minus baseline
PairsArg = Union[None, str, Sequence[Union[str, Tuple[str, str]]]]
HOW = "--baseline MODEL (each model against it) or --pairs BASELINE:MODEL,... (Python: baseline=, pairs=)"


def parse_pairs(pairs: PairsArg) -> Pairs:
    """``"deit:pid_deit,fan:pid_fan"``, a list of such strings or of (baseline, method) tuples."""
    if pairs is None:
        return []
    items = str(pairs).split(",") if isinstance(pairs, str) else list(pairs)
    out: Pairs = []
    for it in items:
        if isinstance(it, str):
            if not it.strip():
                continue
            if it.count(":") != 1:
                raise UserError(f"--pairs {it!r}: expected BASELINE:MODEL, e.g. deit:pid_deit")
            a, b = (t.strip() for t in it.split(":"))
        else:
            a, b = (str(t) for t in it)
        if not a or not b or a == b:
            raise UserError(f"--pairs {a}:{b}: a pair needs two different models, e.g. deit:pid_deit")
        if (a, b) not in out:
            out.append((a, b))
    return out


def choose_pairs(order: Sequence[str], pairs: PairsArg = None, baseline: Optional[str] = None,
                 compare: bool = True) -> Tuple[Pairs, List[str]]:
    """(the pairs to compare, the notes that say why these): given pairs, else each model against ``baseline``,
    else the one pair of two models; more models without either compare nothing, and a note says how to ask."""
    if not compare:
        return [], []
    if pairs is not None and baseline is not None:
        raise UserError("give --pairs or --baseline, not both (each model against the baseline is a list of pairs)")
    given = parse_pairs(pairs)
    for name in [baseline] if baseline is not None else [m for p in given for m in p]:
        if name not in order:
            raise UserError(f"model {name!r} (--baseline/--pairs) is not in the table; its models: {', '.join(order)}")
    if given:
        return given, []
    if baseline is not None:
        return [(baseline, m) for m in order if m != baseline], []
    if len(order) == 2:
        return [(order[0], order[1])], []
    if len(order) < 2:
        return [], []
    n = len(order) * (len(order) - 1) // 2
    return [], [f"Δ and p: none shown for {len(order)} models ({n} pairs); name the comparisons with {HOW}"]


def pair_cells(order_pairs: Pairs, cells: Mapping[str, Mapping[str, Any]], records: Optional[pd.DataFrame],
               label: str, n_boot: int, seed: int, tests_used: Dict[str, List[int]],
               pair_notes: List[Tuple[str, str]]) -> Dict[str, str]:
    """The Δ and p cells of one table row for each pair; the tests used (with n) and per-row notes are collected
    in ``tests_used`` / ``pair_notes``. A Δ on fewer samples than a cell's own n says so: ``+1.25 (n=60)``."""
    out: Dict[str, str] = {}
    short = label.split(" (")[0]
    for a, b in order_pairs:
        ca, cb = cells.get(a), cells.get(b)
        dcol, pcol = delta_column(a, b), p_column(a, b)
        if ca is None or cb is None:
            out[dcol], out[pcol] = MISSING, "n/a"
            continue
        if str(ca.get("settings_id") or "") != str(cb.get("settings_id") or ""):  # as compare_models refuses it
            out[dcol], out[pcol] = "n/a", "n/a"
            pair_notes.append((short, f"p n/a: {a} and {b} were measured under other settings: no Δ or test between "
                                      f"them"))
            continue
        comp = compare_rows(ca, cb, records, n_boot=n_boot, seed=seed)
        out[dcol], out[pcol] = fmt_delta(comp.delta), fmt_p(comp.pvalue, floor=comp.p_floor)
        if comp.test and comp.n not in tests_used.setdefault(comp.test, []):
            tests_used[comp.test].append(comp.n)
        elif comp.note and not comp.test:
            pair_notes.append((short, f"p n/a: {comp.note}"))
        if comp.test and comp.n and any(pd.notna(c.get("n")) and int(c["n"]) != comp.n for c in (ca, cb)):
            out[dcol] += f" (n={comp.n})"
            pair_notes.append((short, "Δ and p with (n=…) are on the samples both runs have, fewer than a cell's own n"))
    return out


def delta_column(a: str, b: str) -> str:
    return f"Δ {b}−{a}"


def p_column(a: str, b: str) -> str:
    return f"p {b} vs {a}"


def pair_legend(order_pairs: Pairs, tests_used: Mapping[str, List[int]], pair_notes: List[Tuple[str, str]]) -> List[str]:
    """The notes under a table with Δ / p columns: what Δ and p are, then each per-row note once with its rows."""
    if not order_pairs:
        return []
    what = "Δ: the later-named model minus the earlier, in points (BASELINE:MODEL pairs)"
    notes = [what + ("; p: two-sided paired test on the same samples (" +
                     "; ".join(f"{t}, n={'/'.join(map(str, sorted(n)))}" for t, n in tests_used.items()) +
                     "); * p < 0.05" if tests_used else "; p: n/a (see below)")]
    by_note: Dict[str, List[str]] = {}
    for lab, note in pair_notes:
        if lab not in by_note.setdefault(note, []):
            by_note[note].append(lab)
    for note, labs in by_note.items():
        head, _, rest = note.partition(": ")
        notes.append(f"{head} for {', '.join(labs)}: {rest}" if head == "p n/a" else f"{note} ({', '.join(labs)})")
    return notes
