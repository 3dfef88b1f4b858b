"""One eps formatter (k/255 only for L-inf eps that are exact multiples of 1/255 below 1) and its parser."""
from __future__ import annotations

import pytest

from robustbench_pid.errors import UserError
from robustbench_pid.core.labels import attack_title, eps_text, parse_eps


@pytest.mark.parametrize("eps,norm,text", [
    (3 / 255, "linf", "3/255"),
    (1 / 255, "linf", "1/255"),
    (1.0, "linf", "1"),            # 255/255 is the whole pixel range: plain 1, not "255/255"
    (1.0, "l2", "1"),              # CW's default eps
    (0.2, "l2", "0.2"),            # an L2 eps is never a pixel fraction, even when 0.2 = 51/255
    (51 / 255, "l2", "0.2"),
    (2.0, "l1", "2"),              # SLD
    (10.0, "l1", "10"),
    (0.1, "linf", "0.1"),          # SPSA's 0.1 is no multiple of 1/255
    (3 / 255, "", "0.0117647"),    # no recorded norm (old tidy CSVs): %g
    (0.0, "linf", "0"),
    (float("nan"), "linf", "0"),
])
def test_eps_text(eps, norm, text):
    assert eps_text(eps, norm) == text


def test_attack_title_prefers_the_recorded_label():
    assert attack_title("cw", "CW-L2") == "CW-L2"
    assert attack_title("spsa", "") == "SPSA"
    assert attack_title("spsa", float("nan")) == "SPSA"  # an empty CSV cell


def test_parse_eps_reads_fractions_and_refuses_the_rest():
    assert parse_eps("4/255") == pytest.approx(4 / 255)
    assert parse_eps("0.3") == pytest.approx(0.3)
    with pytest.raises(UserError, match="malformed eps 'x'"):
        parse_eps("x")
    with pytest.raises(UserError, match=">= 0"):
        parse_eps("-1/255")
