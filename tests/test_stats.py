"""Intervals and paired tests against hand-computed values."""
from __future__ import annotations

import math

import numpy as np
import pytest

from robustbench_pid.results.stats.stats import (bootstrap_interval, mcnemar_exact, mcnemar_from_counts,
                                   newcombe_difference_interval, paired_bootstrap, wilson_interval)


@pytest.mark.parametrize("k,n,lo,hi", [
    # 5/10: centre 0.5, half-width z*sqrt(0.025 + z^2/400)/(1 + z^2/10) = 0.263407
    (5, 10, 0.236593, 0.763407),
    # 0/10: lower 0, upper z^2/(n + z^2) = 3.841459/13.841459
    (0, 10, 0.0, 3.841459 / 13.841459),
    (10, 10, 1 - 3.841459 / 13.841459, 1.0),
    # 8/10: the textbook value (0.4902, 0.9433)
    (8, 10, 0.490162, 0.943318),
])
def test_wilson_hand_computed(k, n, lo, hi):
    got = wilson_interval(k, n)
    assert got[0] == pytest.approx(lo, abs=1e-6)
    assert got[1] == pytest.approx(hi, abs=1e-6)


def test_wilson_empty_is_nan():
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


@pytest.mark.parametrize("only_a,only_b,p", [
    (1, 6, 2 * (1 + 7) / 2 ** 7),          # 2 * P(X <= 1), X ~ Bin(7, 1/2) = 16/128
    (0, 5, 2 / 2 ** 5),                     # 2 * P(X = 0), X ~ Bin(5, 1/2)
    (2, 8, 2 * (1 + 10 + 45) / 2 ** 10),    # 112/1024
    (3, 3, 1.0),                            # symmetric: capped at 1
    (0, 0, 1.0),                            # no discordant pairs: no evidence
])
def test_mcnemar_exact_hand_computed(only_a, only_b, p):
    r = mcnemar_from_counts(only_a, only_b)
    assert r.pvalue == pytest.approx(p, rel=1e-12)
    assert r.significant == (p < 0.05)


def test_mcnemar_from_arrays_counts_discordant_pairs_only():
    # 20 samples: 10 both right, 3 both wrong, 1 only A right, 6 only B right
    a = np.array([1] * 10 + [0] * 3 + [1] + [0] * 6, dtype=bool)
    b = np.array([1] * 10 + [0] * 3 + [0] + [1] * 6, dtype=bool)
    r = mcnemar_exact(a, b)
    assert (r.n, r.only_a, r.only_b) == (20, 1, 6)
    assert r.pvalue == pytest.approx(16 / 128)
    assert r.delta == pytest.approx(100 * (6 - 1) / 20)  # accuracy(B) - accuracy(A) in points
    with pytest.raises(ValueError):
        mcnemar_exact(a, b[:-1])


def _mean_pct(x):
    return 100.0 * float(np.mean(x))


def test_paired_bootstrap_identical_models_no_difference():
    x = np.random.default_rng(1).random(200) < 0.7
    r = paired_bootstrap(_mean_pct, x, x.copy(), n_boot=300, seed=0)
    assert r.delta == 0 and r.ci_low == 0 and r.ci_high == 0
    assert r.pvalue == 1.0 and not r.significant


def test_paired_bootstrap_detects_a_consistent_paired_gain():
    # B is A plus 10 extra correct samples out of 200: a small gain, but every discordant pair favours B.
    a = np.zeros(200, dtype=bool)
    a[:120] = True
    b = a.copy()
    b[120:130] = True
    r = paired_bootstrap(_mean_pct, a, b, n_boot=1000, seed=0)
    assert r.delta == pytest.approx(5.0)
    assert r.value_a == pytest.approx(60.0) and r.value_b == pytest.approx(65.0)
    assert r.ci_low > 0  # every resample keeps B >= A
    assert r.pvalue <= 0.01 and r.significant
    # the same seed gives the same answer
    assert paired_bootstrap(_mean_pct, a, b, n_boot=1000, seed=0) == r


def test_paired_bootstrap_multi_array_and_strata():
    rng = np.random.default_rng(0)
    label = np.r_[np.ones(30, bool), np.zeros(70, bool)]
    sa, sb = rng.random(100), rng.random(100)

    def positive_share(score, lab):
        return 100.0 * lab.mean()

    # resampling within strata keeps the positive share fixed in every resample
    r = paired_bootstrap(positive_share, (sa, label), (sb, label), n_boot=200, seed=0, strata=label)
    assert r.delta == 0 and r.ci_low == 0 and r.ci_high == 0
    v, lo, hi = bootstrap_interval(positive_share, (sa, label), n_boot=200, seed=0, strata=label)
    assert v == lo == hi == pytest.approx(30.0)
    with pytest.raises(ValueError):
        paired_bootstrap(_mean_pct, sa, sb[:50])


def test_bootstrap_interval_close_to_wilson_for_a_proportion():
    x = np.r_[np.ones(300, bool), np.zeros(60, bool)]
    v, lo, hi = bootstrap_interval(_mean_pct, x, n_boot=2000, seed=0)
    wlo, whi = wilson_interval(300, 360)
    assert v == pytest.approx(100 * 300 / 360)
    assert lo == pytest.approx(100 * wlo, abs=1.5) and hi == pytest.approx(100 * whi, abs=1.5)


def test_newcombe_published_example():
    # Newcombe (1998), method 10: 56/70 vs 48/80 -> difference 0.2000, 95% CI (0.0524, 0.3339)
    l1, h1 = wilson_interval(56, 70)
    l2, h2 = wilson_interval(48, 80)
    lo, hi = newcombe_difference_interval(56 / 70, l1, h1, 48 / 80, l2, h2)
    assert lo == pytest.approx(0.0524, abs=1e-4) and hi == pytest.approx(0.3339, abs=1e-4)


def test_average_precision_equals_sklearn_with_ties():
    from sklearn.metrics import average_precision_score

    from robustbench_pid.results.stats.stats import average_precision

    rng = np.random.default_rng(3)
    for _ in range(5):
        y = rng.random(200) < 0.2
        s = np.round(rng.normal(size=200) + y, 1)  # rounding makes ties
        assert average_precision(s, y) == pytest.approx(100 * average_precision_score(y, s), abs=1e-9)
    # constant scores: AP = the positive rate (chance)
    y = np.r_[np.ones(20, bool), np.zeros(100, bool)]
    assert average_precision(np.zeros(120), y) == pytest.approx(100 * 20 / 120)
