"""The convergence ladder's stop rule, once: which samples are near, the tolerance, and the verdict, as pure
functions of a per-sample evidence table (numpy and pandas only, so the result side can judge a condition from its
records exactly as the ladder judged each work unit while it ran).

The rule as docs/attacks.md states it (between its ``stop-rule`` markers; the ladder's docstring carries the same
text) is in ``benchmarks/ladder/__init__.py``. Here: the sentences about near samples, the tolerance and the
statuses. The evidence table has one row per sample and these columns:

- ``robust``: top-1 correct after every rung;
- ``no_gradient``: the CE and DLR input gradients are zero or not finite (only the gradient-free rungs attacked it);
- ``misleads``: the gradient probe flagged it (a step along the gradient raised the loss no more than one against
  it, or two gradient draws agreed less than they differed);
- ``left_gradient`` / ``left_free``: the lowest verdict margin the gradient families / Square reached, as a share of
  the clean margin (inf: none reached);
- ``full_gradient`` / ``full_free``: that kind's full budget was spent on it (or it broke first);
- ``last_broke``: the last round of its work unit broke it;
- ``tau``: its work unit's final tau;
- ``rivals``: in its work unit Square came nearer than the gradient families on more still-robust samples than the
  tolerance (:func:`rivals`), so no margin ranks where Square breaks: every sample is near for Square;
- ``edge``: its work unit's edge share (design 13; 0: none); ``restarted``: as an edge sample (:func:`on_edge`) it
  had its fresh starts (design 15: ``FRESH`` of each kind that left it within the edge, until one broke it; designs
  13 and 14: one of every family);
- ``random`` / ``batch``: its unit's outputs are random / depend on the batch.
"""
from __future__ import annotations

import math
from typing import List, Sequence, Tuple, Union

import numpy as np
import pandas as pd

CONVERGED, NOT_CONVERGED, UPPER_BOUND = "converged", "not converged", "upper bound: gradients unavailable"
BATCH_DEPENDENT = "not converged: outputs depend on the batch"
MISLED = "upper bound: gradients mislead"  # only on the gradient probe's evidence (design 11)
RANDOM_OUTPUTS = "not converged: outputs are random"  # repeated passes disagree: each verdict is one draw
REDUCED = "converged (reduced ladder"  # + ": settings below the defaults)": a weaker ladder says so in its status
STATUSES = (CONVERGED, NOT_CONVERGED, UPPER_BOUND, BATCH_DEPENDENT, MISLED, RANDOM_OUTPUTS)
COLUMNS = ("robust", "no_gradient", "misleads", "left_gradient", "left_free", "full_gradient", "full_free",
           "last_broke", "tau", "rivals", "edge", "restarted", "random", "batch")


def share_left(margin: np.ndarray, clean: np.ndarray) -> np.ndarray:
    """The share of the clean verdict margin a search left (inf where it reached none or there is no clean margin)."""
    m = np.asarray(margin, dtype=float)
    c = np.maximum(np.asarray(clean, dtype=float), 1e-12)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = m / c
    return np.where(np.isnan(out), np.inf, out)


def reductions_of(status: str) -> List[str]:
    """The reductions a unit's ``converged (reduced ladder (...))`` status names ([] for any other status)."""
    s = str(status)
    if not s.startswith(REDUCED + " ("):
        return []
    return [r for r in s[len(REDUCED) + 2:-1].split(", ") if r]


def tolerance(n: int, share: float, least: int) -> int:
    """How many samples the last round may still break: max(least, floor(share * n)) (``least`` is 0 by default:
    the tolerance is a share of the samples, and a unit of fewer than 1/share samples may break none)."""
    return max(int(least), int(math.floor(float(share) * int(n) + 1e-9)))


def near(left_gradient: np.ndarray, left_free: np.ndarray, tau: float,
         rivals: Union[bool, np.ndarray] = False) -> Tuple[np.ndarray, np.ndarray]:
    """(near for the gradient families, near for Square) at ``tau``: a gradient family left at most tau of the clean
    margin; Square did, or came nearer than the gradient families (there its search is the only evidence), or Square
    is their rival (``rivals``, per unit; design 14): on such a model no margin ranks where Square's longer search
    breaks, so every sample is near for Square, as AutoAttack gives its Square every sample its gradient attacks
    left. At tau >= 1 every sample is near for both (the widest round takes every still-robust sample)."""
    g = np.asarray(left_gradient, dtype=float)
    f = np.asarray(left_free, dtype=float)
    if tau >= 1:
        every = np.ones(len(g), dtype=bool)
        return every, every.copy()
    return g <= tau, (f <= tau) | (f < g) | np.asarray(rivals, dtype=bool)


def rivals(left_gradient: np.ndarray, left_free: np.ndarray, robust: np.ndarray, tol: int) -> bool:
    """Square came nearer than the gradient families on more still-robust samples than the tolerance: the gradient
    families are not everywhere the nearer search, so their margins do not say where Square's search breaks."""
    g, f = np.asarray(left_gradient, dtype=float), np.asarray(left_free, dtype=float)
    return int((np.asarray(robust, dtype=bool) & (f < g)).sum()) > int(tol)


def starts_for(risk: float) -> int:
    """The fewest whole-budget starts s of one attack on a sample for which p (1 - p)^s, the chance that one start of
    AutoAttack's (crossing with probability p) breaks it while all s of equal strength missed, stays below ``risk``
    whatever p is: the largest value, at p = 1 / (s + 1), is s^s / (s + 1)^(s + 1)."""
    s = 1
    while s ** s / (s + 1) ** (s + 1) >= risk:
        s += 1
    return s


MISS_RISK = 0.05  # the chance allowed, per edge sample, that AutoAttack's one start crosses where all of ours missed
FRESH = starts_for(MISS_RISK) - 1  # 6: fresh starts of each kind on its edge samples, besides its full budget's run


def edge_kinds(left_gradient: np.ndarray, left_free: np.ndarray,
               edge: Union[float, np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """(the gradient families, Square) left the sample within ``edge`` of the boundary (a share of the clean margin):
    there the last few steps of one random start decide whether the sample breaks, so another start of that kind,
    fresh, may decide otherwise (AutoAttack's later attacks and restarts are such starts)."""
    e = np.asarray(edge, dtype=float)
    return np.asarray(left_gradient, dtype=float) <= e, np.asarray(left_free, dtype=float) <= e


def on_edge(left_gradient: np.ndarray, left_free: np.ndarray, edge: Union[float, np.ndarray]) -> np.ndarray:
    """The samples some kind of family left within ``edge`` (:func:`edge_kinds`)."""
    g, f = edge_kinds(left_gradient, left_free, edge)
    return g | f


def owed(ev: pd.DataFrame) -> np.ndarray:
    """Per sample: still robust, near at its unit's tau for a kind whose full budget it did not get, or on the edge
    without its fresh starts."""
    out = on_edge(ev["left_gradient"].to_numpy(float), ev["left_free"].to_numpy(float),
                  ev["edge"].to_numpy(float)) & ~ev["restarted"].to_numpy(bool)
    for tau in np.unique(ev["tau"].to_numpy(float)):
        at = ev["tau"].to_numpy(float) == tau
        g, f = near(ev["left_gradient"].to_numpy(float)[at], ev["left_free"].to_numpy(float)[at], float(tau),
                    ev["rivals"].to_numpy(bool)[at])
        out[at] |= (g & ~ev["full_gradient"].to_numpy(bool)[at]) | (f & ~ev["full_free"].to_numpy(bool)[at])
    return out & ev["robust"].to_numpy(bool)


def verdict(ev: pd.DataFrame, tol: int, reduced: Sequence[str] = ()) -> Tuple[str, str]:
    """(status, reasons) of a work unit or a whole condition from its evidence table (the module docstring)."""
    missing = [c for c in COLUMNS if c not in ev.columns]
    if missing:
        raise ValueError(f"stop-rule evidence lacks column(s) {missing}")
    robust = ev["robust"].to_numpy(bool)
    left = int(robust.sum())
    k = int((robust & ev["no_gradient"].to_numpy(bool)).sum())
    if k > tol:
        return UPPER_BOUND, (f"input gradients are zero or not finite for both CE and DLR losses on {k} still-robust "
                             f"sample(s) (tolerance {tol}); only gradient-free rungs could attack them, so the robust "
                             f"accuracy is only an upper bound")
    if bool(ev["batch"].to_numpy(bool).any()):
        return BATCH_DEPENDENT, ("the model's outputs for a sample change with the other samples in its batch (a "
                                 "batch-level statistic, or BatchNorm left in training mode), so a verdict scored in one "
                                 "batch need not hold in another: no robust accuracy can be called converged")
    if bool(ev["random"].to_numpy(bool).any()):
        return RANDOM_OUTPUTS, ("repeated forward passes of the same images disagree (a randomised model), so each "
                                "verdict is one random draw: the robust accuracy is an estimate of a random quantity "
                                "and no round can show it converged (the EOT rungs attacked the expected loss)")
    status = f"{REDUCED} ({', '.join(reduced)})" if reduced else CONVERGED
    if not left:
        return status, "no sample is left robust"
    k = int((robust & ev["misleads"].to_numpy(bool)).sum())
    if k > tol:
        return MISLED, (f"the gradient probe flags {k} still-robust sample(s) (tolerance {tol}): a step along the "
                        f"gradient raised the loss no more than the same step against it, or two gradient draws "
                        f"agreed less than they differed; the gradient attacks' failure is no evidence there and a "
                        f"finite random search proves nothing, so the robust accuracy is only an upper bound")
    k = int(owed(ev).sum())
    if k > tol:
        return NOT_CONVERGED, (f"{k} near or edge still-robust sample(s) did not get a family's full budget or their "
                               f"fresh starts (tolerance {tol}): the number is an upper bound")
    broke = int(ev["last_broke"].to_numpy(bool).sum())
    taus = ev.loc[robust, "tau"].to_numpy(float)
    widest = float(np.max(taus)) if len(taus) else 0.0
    had_all = bool((ev["full_gradient"].to_numpy(bool) & ev["full_free"].to_numpy(bool))[robust].all())
    where = ("every still-robust sample" if widest >= 1 or had_all else
             f"every sample within tau = {widest:g} of its clean margin")
    if broke > tol:
        return NOT_CONVERGED, (f"{where} had the full budget and the last round still broke {broke} sample(s) "
                               f"(tolerance {tol}): the number is an upper bound")
    return status, (f"{where} had each family's full AutoAttack budget, and the last round broke {broke} sample(s) "
                    f"(tolerance {tol})")
