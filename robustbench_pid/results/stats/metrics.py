"""Metrics as small pure functions (tested against hand-computed values)."""
from __future__ import annotations

import math
from typing import Dict, Mapping, Sequence, Tuple, Union

import numpy as np

from ...core.imagenet_info import SEVERITIES

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(successes: int, n: int, z: float = Z95) -> Tuple[float, float]:
    """Wilson score interval for a binomial proportion, as fractions in [0, 1]."""
    if n <= 0:
        return (float("nan"), float("nan"))
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # the ends are exact at 0 and n (centre - half is 0 and centre + half is 1 in exact arithmetic, 3.5e-18 and
    # 1 - 1e-16 in floats), and the interval always contains its estimate (plots draw p - lo and hi - p as bars)
    lo = 0.0 if successes <= 0 else min(p, max(0.0, centre - half))
    hi = 1.0 if successes >= n else max(p, min(1.0, centre + half))
    return (lo, hi)


# --------------------------------------------------------------------------- corruption robustness

BaselineSpec = Union[str, Mapping[str, Union[float, Sequence[float]]]]


def _rates(v: Union[float, Sequence[float]], what: str) -> np.ndarray:
    """Error rates as an array, refused unless finite and in [0, 1]: an error in percent (30 for 30%)
    would otherwise give a CE a hundred times too large."""
    arr = np.atleast_1d(np.asarray(v if isinstance(v, (int, float, np.floating)) else list(v), dtype=float))
    if arr.size == 0:
        raise ValueError(f"empty error list for {what}")
    if not np.all(np.isfinite(arr)) or arr.min() < 0 or arr.max() > 1:
        raise ValueError(f"errors for {what} must be rates in [0, 1] (a top-1 error of 30% is 0.3), got "
                         f"{arr.tolist()}")
    return arr


def _mean_err(v: Union[float, Sequence[float]], what: str = "a corruption") -> float:
    """A per-corruption error given as one number (the mean over severities) or per severity."""
    return float(_rates(v, what).mean())


def _severities(errs: Union[float, Sequence[float]], base: Union[float, Sequence[float]], c: str) -> None:
    """Per-severity errors against a baseline: the ratio of means is CE only over the same severities, so a
    list must cover all 5 against a published mean (AlexNet's) and match a per-severity baseline's length."""
    n = None if isinstance(errs, (int, float, np.floating)) else len(list(errs))
    nb = None if isinstance(base, (int, float, np.floating)) else len(list(base))
    if n is None:
        return
    want = nb if nb is not None else len(SEVERITIES)
    if n != want:
        raise ValueError(f"{c}: {n} severities of errors against a baseline over {want}; CE compares the same "
                         f"severities (give all {want}, or their mean as one number)")


def _baseline_raw(baseline: BaselineSpec) -> Mapping[str, Union[float, Sequence[float]]]:
    if isinstance(baseline, str):
        if baseline.lower() != "alexnet":
            raise ValueError(f"unknown baseline {baseline!r}: pass 'alexnet' or a mapping corruption -> errors")
        from ...core.imagenet_info import ALEXNET_MEAN_ERR

        return dict(ALEXNET_MEAN_ERR)
    return baseline


def _baseline(baseline: BaselineSpec) -> Dict[str, float]:
    return {k: _mean_err(v, f"baseline {k}") for k, v in _baseline_raw(baseline).items()}


def corruption_errors(errors: Mapping[str, Sequence[float]], baseline: BaselineSpec = "alexnet") -> Dict[str, float]:
    """CE per corruption in percent: 100 x sum_s E_{s,c} / sum_s E^base_{s,c}.

    ``errors`` maps a corruption to its per-severity top-1 error rates in [0, 1]. With equal
    numbers of severities the ratio of sums is the ratio of means, so a baseline may be given as
    per-severity lists or as one mean error per corruption (how the AlexNet values are published).
    """
    raw = _baseline_raw(baseline)
    base = _baseline(baseline)
    out: Dict[str, float] = {}
    for c, errs in errors.items():
        if c not in base:
            raise ValueError(f"no baseline error for corruption {c!r}")
        if base[c] <= 0:
            raise ValueError(f"baseline error for {c!r} is {base[c]}: CE is undefined")
        _severities(errs, raw[c], c)
        out[c] = 100.0 * _mean_err(errs, c) / base[c]
    return out


def mean_corruption_error(errors: Mapping[str, Sequence[float]], baseline: BaselineSpec = "alexnet") -> float:
    """mCE in percent: the mean over corruptions of CE_c (Hendrycks & Dietterich 2019)."""
    ces = corruption_errors(errors, baseline)
    if not ces:
        raise ValueError("no corruptions given")
    return float(np.mean(list(ces.values())))


def relative_mean_corruption_error(errors: Mapping[str, Sequence[float]], clean_error: float,
                                   baseline: BaselineSpec = "alexnet",
                                   baseline_clean_error: float = 0.4348) -> float:
    """Relative mCE in percent: 100 x mean_c (mean_s E_{s,c} - E_clean) / (E^base_c - E^base_clean)."""
    raw = _baseline_raw(baseline)
    base = _baseline(baseline)
    clean_error = _mean_err(clean_error, "the clean error")
    baseline_clean_error = _mean_err(baseline_clean_error, "the baseline's clean error")
    vals = []
    for c, errs in errors.items():
        if c not in base:
            raise ValueError(f"no baseline error for corruption {c!r}")
        denom = base[c] - baseline_clean_error
        if denom == 0:
            raise ValueError(f"baseline error for {c!r} equals the baseline clean error: relative CE undefined")
        _severities(errs, raw[c], c)
        vals.append((_mean_err(errs, c) - clean_error) / denom)
    if not vals:
        raise ValueError("no corruptions given")
    return 100.0 * float(np.mean(vals))


# --------------------------------------------------------------------------- OOD detection

def ood_detection_metrics(in_scores: Sequence[float], out_scores: Sequence[float]) -> Dict[str, float]:
    """AUPR, AUROC and FPR at 95% TPR, in percent; out-of-distribution is the positive class.

    Scores are anomaly scores (higher = more anomalous). AUPR is scikit-learn's
    ``average_precision_score`` (the ImageNet-O protocol); FPR95 is the smallest false-positive
    rate among ROC operating points whose true-positive rate reaches 95%.
    """
    from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

    s_in = np.asarray(in_scores, dtype=float).ravel()
    s_out = np.asarray(out_scores, dtype=float).ravel()
    if s_in.size == 0 or s_out.size == 0:
        raise ValueError("need at least one in-distribution and one out-of-distribution score")
    if not (np.isfinite(s_in).all() and np.isfinite(s_out).all()):
        raise ValueError("scores must be finite")
    y = np.concatenate([np.zeros(s_in.size), np.ones(s_out.size)])
    s = np.concatenate([s_in, s_out])
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    fpr95 = float(fpr[np.searchsorted(tpr, 0.95, side="left")])
    return {
        "aupr": 100.0 * float(average_precision_score(y, s)),
        "auroc": 100.0 * float(roc_auc_score(y, s)),
        "fpr95": 100.0 * fpr95,
        "chance_aupr": 100.0 * s_out.size / s.size,
    }
