"""Statistics for comparing results: intervals and paired tests on the same samples.

Why paired tests: two models evaluated on the same images are strongly correlated (most images are
easy for both), so comparing their two accuracies as independent proportions wastes most of the
information. McNemar's exact test uses only the discordant images (one model right, the other
wrong); the paired bootstrap resamples images once and recomputes both models' metric on the same
resample, which works for any metric (mCE, AUPR) computed from per-sample arrays.

Libraries: the Wilson interval lives in ``metrics.py``; McNemar's exact p-value is scipy's
``binomtest`` on the discordant counts (the exact conditional test); the bootstrap is written here
because it is a few lines of NumPy and must resample several per-sample arrays (and strata) with
the same indices, which scipy.stats.bootstrap does not do for paired multi-array statistics.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple, Union

import numpy as np

from .metrics import Z95, wilson_interval

__all__ = ["wilson_interval", "Z95", "McNemarResult", "mcnemar_exact", "mcnemar_from_counts",
           "BootstrapResult", "paired_bootstrap", "bootstrap_interval", "newcombe_difference_interval",
           "paired_difference_interval", "average_precision"]

ALPHA = 0.05


@dataclass(frozen=True)
class McNemarResult:
    """McNemar's exact test for two paired binary outcomes (A vs B on the same samples).

    ``only_a``: samples A gets right and B wrong; ``only_b``: the reverse. ``delta`` is
    accuracy(B) - accuracy(A) in percent.
    """

    n: int
    only_a: int
    only_b: int
    pvalue: float
    delta: float

    @property
    def significant(self) -> bool:
        return self.pvalue < ALPHA


def mcnemar_from_counts(only_a: int, only_b: int, n: Optional[int] = None) -> McNemarResult:
    """Exact two-sided McNemar p-value from the discordant counts (binomial test, p = 1/2)."""
    from scipy.stats import binomtest

    if only_a < 0 or only_b < 0:
        raise ValueError("discordant counts must be >= 0")
    m = only_a + only_b
    p = 1.0 if m == 0 else float(binomtest(min(only_a, only_b), m, 0.5, alternative="two-sided").pvalue)
    n = m if n is None else n
    delta = 100.0 * (only_b - only_a) / n if n else 0.0
    return McNemarResult(n=int(n), only_a=int(only_a), only_b=int(only_b), pvalue=min(1.0, p), delta=delta)


def mcnemar_exact(correct_a: Sequence[bool], correct_b: Sequence[bool]) -> McNemarResult:
    """McNemar's exact test on per-sample correctness of two models over the SAME samples (same order)."""
    a = np.asarray(correct_a, dtype=bool)
    b = np.asarray(correct_b, dtype=bool)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"need two 1-d arrays of equal length, got shapes {a.shape} and {b.shape}")
    return mcnemar_from_counts(int((a & ~b).sum()), int((~a & b).sum()), n=len(a))


Arrays = Union[np.ndarray, Tuple[np.ndarray, ...]]


MIN_BOOT = 100  # fewer resamples give a 95% interval from a handful of values: its ends are noise


def check_n_boot(n_boot: object) -> int:
    """``--n-boot``, checked where it enters (tables, report): a whole number >= MIN_BOOT."""
    from ...errors import UserError

    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < MIN_BOOT:
        raise UserError(f"--n-boot must be a whole number >= {MIN_BOOT} (bootstrap resamples for the mCE/AUPR "
                        f"intervals; default 1000), got {n_boot!r}")
    return int(n_boot)


def _as_tuple(x: Arrays) -> Tuple[np.ndarray, ...]:
    return tuple(np.asarray(a) for a in (x if isinstance(x, tuple) else (x,)))


def _resample_indices(n: int, n_boot: int, rng: np.random.Generator,
                      strata: Optional[np.ndarray]) -> np.ndarray:
    """(n_boot, n) indices; within each stratum when ``strata`` is given (keeps e.g. the OOD share fixed)."""
    if strata is None:
        return rng.integers(0, n, size=(n_boot, n))
    strata = np.asarray(strata)
    if strata.shape != (n,):
        raise ValueError(f"strata must have shape ({n},), got {strata.shape}")
    out = np.empty((n_boot, n), dtype=np.int64)
    pos = 0
    for s in np.unique(strata):
        members = np.flatnonzero(strata == s)
        k = len(members)
        out[:, pos:pos + k] = members[rng.integers(0, k, size=(n_boot, k))]
        pos += k
    return out


@dataclass(frozen=True)
class BootstrapResult:
    """Paired bootstrap of metric(B) - metric(A) over resampled samples."""

    value_a: float
    value_b: float
    delta: float
    ci_low: float  # percentile interval of the delta
    ci_high: float
    pvalue: float  # two-sided: 2 * min(P*(delta <= 0), P*(delta >= 0)), floored at 1/n_boot
    n: int
    n_boot: int

    @property
    def significant(self) -> bool:
        return self.pvalue < ALPHA


def paired_bootstrap(statistic: Callable[..., float], a: Arrays, b: Arrays, *, n_boot: int = 2000,
                     seed: int = 0, confidence: float = 0.95,
                     strata: Optional[np.ndarray] = None) -> BootstrapResult:
    """Paired bootstrap for any per-sample metric.

    ``a`` and ``b`` are per-sample arrays (or tuples of arrays) of models A and B, aligned on the
    same samples along axis 0; ``statistic(*arrays)`` returns the metric. Each resample draws the
    same sample indices for A and B (that is what makes it paired). ``strata`` (one label per
    sample) resamples within groups, e.g. in-distribution vs OOD for AUPR.
    """
    ta, tb = _as_tuple(a), _as_tuple(b)
    n = len(ta[0])
    if any(len(x) != n for x in ta + tb):
        raise ValueError("all per-sample arrays of A and B must have the same length (the paired samples)")
    if n == 0:
        raise ValueError("no samples to bootstrap")
    if n_boot < 1:
        raise ValueError("n_boot must be >= 1")
    rng = np.random.default_rng(seed)
    idx = _resample_indices(n, n_boot, rng, strata)
    va, vb = float(statistic(*ta)), float(statistic(*tb))
    deltas = np.empty(n_boot)
    for i in range(n_boot):
        j = idx[i]
        deltas[i] = statistic(*(x[j] for x in tb)) - statistic(*(x[j] for x in ta))
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(deltas, [tail, 1 - tail])
    p = 2 * min(float(np.mean(deltas <= 0)), float(np.mean(deltas >= 0)))
    p = min(1.0, max(p, 1.0 / n_boot))
    return BootstrapResult(value_a=va, value_b=vb, delta=vb - va, ci_low=float(lo), ci_high=float(hi),
                           pvalue=p, n=n, n_boot=n_boot)


def bootstrap_interval(statistic: Callable[..., float], arrays: Arrays, *, n_boot: int = 2000, seed: int = 0,
                       confidence: float = 0.95, strata: Optional[np.ndarray] = None) -> Tuple[float, float, float]:
    """(value, low, high): percentile bootstrap interval of one model's metric."""
    t = _as_tuple(arrays)
    n = len(t[0])
    if n == 0:
        raise ValueError("no samples to bootstrap")
    rng = np.random.default_rng(seed)
    idx = _resample_indices(n, n_boot, rng, strata)
    vals = np.array([statistic(*(x[j] for x in t)) for j in idx])
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(vals, [tail, 1 - tail])
    return float(statistic(*t)), float(lo), float(hi)


def newcombe_difference_interval(p_new: float, lo_new: float, hi_new: float,
                                 p_old: float, lo_old: float, hi_old: float) -> Tuple[float, float]:
    """95% interval of (new - old) from the two Wilson intervals (Newcombe 1998, method 10).

    Treats the two proportions as independent, which is conservative when both come from the same
    images (positively correlated), so a drop flagged as significant here is a real one.
    """
    d = p_new - p_old
    low = d - float(np.sqrt((p_new - lo_new) ** 2 + (hi_old - p_old) ** 2))
    high = d + float(np.sqrt((hi_new - p_new) ** 2 + (p_old - lo_old) ** 2))
    return low, high


def paired_difference_interval(only_a: int, only_b: int, n: int) -> Tuple[float, float]:
    """95% interval of accuracy(B) - accuracy(A), in percent, for two models on the SAME ``n`` samples.

    Bonett & Price (2012), adjusted Wald for paired proportions: add one to each discordant count and
    two to n. It uses the discordant counts as McNemar's test does (so interval and p-value agree in
    sign), keeps near-nominal coverage down to small n and never leaves [-100, 100]. Neither scipy nor
    the installed libraries ship a paired-difference interval, and it is three lines.
    """
    if n <= 0 or only_a < 0 or only_b < 0 or only_a + only_b > n:
        raise ValueError(f"need 0 <= discordant counts with only_a + only_b <= n > 0, got {only_a}, {only_b}, {n}")
    pa, pb = (only_a + 1) / (n + 2), (only_b + 1) / (n + 2)
    d = pb - pa
    half = Z95 * float(np.sqrt(max(pa + pb - d * d, 0.0) / (n + 2)))
    return 100.0 * max(-1.0, d - half), 100.0 * min(1.0, d + half)


def average_precision(score: np.ndarray, positive: np.ndarray) -> float:
    """Average precision in percent, the same definition as scikit-learn's ``average_precision_score``
    (sum over distinct thresholds of recall increase x precision). A NumPy version because the
    bootstrap calls it thousands of times and sklearn's input validation dominates at that rate."""
    s = np.asarray(score, dtype=float)
    y = np.asarray(positive, dtype=bool)
    n_pos = int(y.sum())
    if n_pos == 0:
        return float("nan")
    order = np.argsort(-s, kind="mergesort")
    s, y = s[order], y[order]
    last = np.r_[np.flatnonzero(np.diff(s) != 0), len(s) - 1]  # last index of each distinct score
    tp = np.cumsum(y)[last]
    fp = (last + 1) - tp
    precision = tp / (tp + fp)
    recall = tp / n_pos
    return 100.0 * float(np.sum(np.diff(np.r_[0.0, recall]) * precision))

