"""Metrics against hand-computed values."""
from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from robustbench_pid.core.imagenet_info import ALEXNET_MEAN_ERR, CORRUPTIONS_15
from robustbench_pid.results.stats.metrics import (corruption_errors, mean_corruption_error, ood_detection_metrics,
                                     relative_mean_corruption_error, wilson_interval)


def test_wilson_interval_hand_computed():
    lo, hi = wilson_interval(8, 10)
    # p=.8, z^2=3.8415: centre=(.8+.19207)/1.38415=.71674, half=1.95996*sqrt(.016+.0096)/1.38415=.22657
    assert lo == pytest.approx(0.49016, abs=1e-4) and hi == pytest.approx(0.94331, abs=1e-4)


def test_mce_two_corruptions_custom_baseline():
    errors = {"a": [0.1, 0.2, 0.3, 0.4, 0.5], "b": [0.5, 0.5, 0.5, 0.5, 0.5]}
    base = {"a": [0.2, 0.4, 0.6, 0.8, 1.0], "b": [0.25] * 5}
    # CE_a = 1.5 / 3.0 = 0.5 ; CE_b = 2.5 / 1.25 = 2.0 ; mCE = 100 * 1.25
    assert corruption_errors(errors, base) == pytest.approx({"a": 50.0, "b": 200.0})
    assert mean_corruption_error(errors, base) == pytest.approx(125.0)
    # a baseline given as one mean error per corruption is the same thing
    assert mean_corruption_error(errors, {"a": 0.6, "b": 0.25}) == pytest.approx(125.0)


def test_mce_all_severities_equal_to_alexnet_is_100():
    errors = {c: [ALEXNET_MEAN_ERR[c]] * 5 for c in CORRUPTIONS_15}
    assert mean_corruption_error(errors) == pytest.approx(100.0)
    # all severities equal to 0.5: CE_c = 0.5 / alexnet_c
    half = {c: [0.5] * 5 for c in CORRUPTIONS_15}
    expected = 100 * np.mean([0.5 / ALEXNET_MEAN_ERR[c] for c in CORRUPTIONS_15])
    assert mean_corruption_error(half, "alexnet") == pytest.approx(expected)
    assert expected == pytest.approx(64.673, abs=1e-3)  # sum of 0.5/E_c by hand = 9.7009; /15


def test_relative_mce_hand_computed():
    errors = {"a": [0.3] * 5, "b": [0.2, 0.4, 0.6, 0.4, 0.4]}
    base = {"a": 0.8, "b": 0.6}
    # (0.3-0.1)/(0.8-0.4)=0.5 ; (0.4-0.1)/(0.6-0.4)=1.5 ; mean 1.0
    assert relative_mean_corruption_error(errors, 0.1, base, 0.4) == pytest.approx(100.0)
    alex = {c: [ALEXNET_MEAN_ERR[c]] * 5 for c in CORRUPTIONS_15}
    assert relative_mean_corruption_error(alex, 0.4348) == pytest.approx(100.0)


def test_metric_errors():
    with pytest.raises(ValueError):
        mean_corruption_error({"unknown": [0.1] * 5})
    with pytest.raises(ValueError):
        mean_corruption_error({}, "alexnet")
    with pytest.raises(ValueError):
        mean_corruption_error({"a": [0.1]}, "resnet")


def test_ood_metrics_hand_computed():
    # OOD scores 0.9, 0.4 ; in-distribution 0.1, 0.5, 0.2
    m = ood_detection_metrics([0.1, 0.5, 0.2], [0.9, 0.4])
    # ranking: .9(+) .5(-) .4(+) .2(-) .1(-): AP = (1/1 + 2/3)/2 = 0.8333
    assert m["aupr"] == pytest.approx(100 * (1 + 2 / 3) / 2)
    # AUROC: pairs (pos>neg): .9 beats 3, .4 beats 2 -> 5/6
    assert m["auroc"] == pytest.approx(100 * 5 / 6)
    # TPR reaches 100% (>= 95%) only at threshold .4 where FPR = 1/3
    assert m["fpr95"] == pytest.approx(100 / 3)
    assert m["chance_aupr"] == pytest.approx(40.0)


def test_aupr_equals_sklearn_on_random_scores_and_positive_rate_for_constant():
    rng = np.random.default_rng(0)
    s_in, s_out = rng.normal(size=1000), rng.normal(0.5, 1, size=200)
    m = ood_detection_metrics(s_in, s_out)
    y = np.r_[np.zeros(1000), np.ones(200)]
    assert m["aupr"] == pytest.approx(100 * average_precision_score(y, np.r_[s_in, s_out]))
    c = ood_detection_metrics(np.zeros(10000), np.zeros(2000))
    assert c["aupr"] == pytest.approx(100 * 2000 / 12000) == pytest.approx(16.6667, abs=1e-4)
    assert c["auroc"] == pytest.approx(50.0) and c["fpr95"] == pytest.approx(100.0)
    assert math.isclose(c["chance_aupr"], c["aupr"])
    # perfect separation
    p = ood_detection_metrics([0, 1, 2], [5, 6])
    assert (p["aupr"], p["auroc"], p["fpr95"]) == (100.0, 100.0, 0.0)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 10, 48, 96, 100, 333, 500, 999, 1000])
def test_wilson_interval_contains_its_estimate_at_every_count(n):
    for k in range(n + 1):
        lo, hi = wilson_interval(k, n)
        assert 0.0 <= lo <= k / n <= hi <= 1.0, (k, n, lo, hi)


def test_wilson_interval_ends_are_exact_at_0_and_100_percent():
    """Exactly 0.0 below 0% and exactly 1.0 above 100% (issue 33: 3.5e-18 and 1 - 1e-16 broke the error bars)."""
    for n in range(1, 1001):
        lo0, hi0 = wilson_interval(0, n)
        lon, hin = wilson_interval(n, n)
        assert lo0 == 0.0 and hin == 1.0, n
        assert 0.0 < hi0 < 1.0 and 0.0 < lon < 1.0, n
        assert hi0 == pytest.approx(1.0 - lon, abs=1e-12)  # the two are mirror images
