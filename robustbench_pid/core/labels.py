"""How eps values and attacks are written for people: one formatter, one parser, no torch.

Every table, plot, report and terminal line writes eps through :func:`eps_text`; the unit of an
eps comes from the data (the ``norm`` column the results carry), never from importing the attacks.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from ..errors import UserError


def eps_text(eps: Optional[float], norm: Optional[str] = "") -> str:
    """``k/255`` for an L-inf eps that is an exact multiple of 1/255 below 1, ``%g`` otherwise.

    3/255 under L-inf reads ``3/255`` (and 0.5/255 ``0.5/255``: a fraction of 1/255 with at most
    three decimals that has no short decimal form; 0.3 stays ``0.3``); an L2 eps of 0.2 reads ``0.2``; CW's eps 1.0 reads ``1``;
    without a known norm (results from before the norm was recorded) every eps reads ``%g``.
    """
    if eps is None or (isinstance(eps, float) and math.isnan(eps)) or eps == 0:
        return "0"
    eps = float(eps)
    k = round(eps * 255)
    if norm == "linf" and 0 < k < 255 and abs(k / 255 - eps) < 1e-9:
        return f"{k}/255"
    short = f"{eps:.4g}"
    if norm == "linf" and float(short) != eps:  # no short decimal: a fraction of 1/255 (0.5/255) reads as one
        k2 = round(eps * 255, 3)
        if 0 < k2 < 255 and abs(k2 / 255 - eps) < 1e-12:
            return f"{k2:g}/255"
    return f"{eps:g}"


def attack_title(attack: str, label: Any = None) -> str:
    """The display name of an attack: its recorded ``attack_label``, else the name upper-cased."""
    if isinstance(label, str) and label:
        return label
    return str(attack).upper()


def number(text: Any) -> float:
    """``0.03`` or ``8/255`` as a float (ValueError/ZeroDivisionError otherwise; any sign)."""
    s = str(text).strip()
    if "/" in s:
        num, den = s.split("/", 1)
        return float(num) / float(den)
    return float(s)


def parse_eps(text: str, what: str = "eps") -> float:
    """Parse one eps-like value: ``0.03``, ``8/255``. Refuses anything else with a clear message
    naming ``what`` (``eps``, ``--step-size``, ...)."""
    try:
        value = number(text)
    except (ValueError, ZeroDivisionError):
        example = "numbers like 0.03 or 8/255, comma-separated" if what == "eps" else "a number like 0.01 or 2/255"
        raise UserError(f"malformed {what} {text!r}: give {example}") from None
    if not math.isfinite(value) or value < 0 or str(text).strip().startswith("-"):  # -4/-255 is no budget either
        raise UserError(f"{what} {text!r} must be a finite number >= 0")
    return value
