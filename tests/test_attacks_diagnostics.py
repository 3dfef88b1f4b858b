"""Gradient-masking diagnostics: each check fires on the pattern it names and stays quiet otherwise."""
from __future__ import annotations

import pandas as pd

from robustbench_pid.results.report.diagnostics import (Finding, check_black_box, check_eps_monotone, check_unbounded,
                                         check_pgd_vs_fgsm, check_zero_gradients, diagnose, format_findings)

IDS = dict(run_id="r", model="m", checkpoint_sha256="abc", dataset="digits", protocol="standard",
           benchmark="adversarial")


def tidy(rows):
    return pd.DataFrame([{**IDS, "attack": a, "eps": e, "metric": "top1", "value": v, "n": 100}
                         for a, e, v in rows])


def records(attack, eps, correct, grad_zero):
    return pd.DataFrame([{**IDS, "attack": attack, "eps": eps, "params": "{}", "sample_id": str(i),
                          "correct_top1": bool(c), "correct_top5": True, "attacked": True, "grad_zero": g}
                         for i, (c, g) in enumerate(zip(correct, grad_zero))])


def test_eps_monotone():
    ok = tidy([("pgd", 1 / 255, 80), ("pgd", 2 / 255, 60), ("pgd", 3 / 255, 60.5)])
    assert check_eps_monotone(ok) == []
    bad = tidy([("pgd", 1 / 255, 80), ("pgd", 2 / 255, 60), ("pgd", 3 / 255, 70)])
    (f,) = check_eps_monotone(bad)
    assert f.code == "eps-not-monotone" and f.attack == "pgd" and abs(f.eps - 3 / 255) < 1e-12
    assert f.value == 10 and "3/255" in f.message
    noise = tidy([("noise", 0.1, 50), ("noise", 0.2, 90)])  # not a worst case: not checked
    assert check_eps_monotone(noise) == []


def test_pgd_above_fgsm():
    assert check_pgd_vs_fgsm(tidy([("fgsm", 0.01, 50), ("pgd", 0.01, 30)])) == []
    (f,) = check_pgd_vs_fgsm(tidy([("fgsm", 0.01, 50), ("pgd", 0.01, 55), ("pgd", 0.02, 90)]))
    assert f.code == "pgd-above-fgsm" and f.eps == 0.01 and f.value == 5


def test_black_box_beats_white_box():
    assert check_black_box(tidy([("pgd", 0.1, 20), ("spsa", 0.1, 30)])) == []
    found = check_black_box(tidy([("pgd", 0.1, 20), ("fgsm", 0.1, 40), ("spsa", 0.1, 5), ("square", 0.1, 10)]))
    assert {f.attack for f in found} == {"spsa", "square"}
    assert all(f.code == "black-box-beats-white-box" for f in found)


def test_an_unbounded_attack_that_leaves_samples_correct_is_not_working_and_eps_size_alone_says_nothing():
    # an adversarially trained MNIST-style model keeps 88% at the field's standard eps 0.3: no finding from eps alone
    assert check_unbounded(tidy([("pgd", 0.3, 88.0), ("pgd", 0.5, 35.0)])) == []
    t = tidy([("pgd", 0.3, 88.0), ("pgd", 1.0, 0.0), ("square", 1.0, 12.5)])
    t["condition"] = ["", "unconstrained", "unconstrained"]
    (f,) = check_unbounded(t)
    assert f.code == "unbounded-not-zero" and f.attack == "square" and f.value == 12.5
    assert "whole pixel box" in f.message and "0%" in f.message


def test_zero_gradients_need_records():
    r = records("pgd", 0.01, [1] * 10, [True] * 2 + [False] * 8)
    (f,) = check_zero_gradients(r)
    assert f.code == "zero-gradients" and f.value == 20.0
    assert check_zero_gradients(records("pgd", 0.01, [1] * 10, [False] * 10)) == []
    assert check_zero_gradients(tidy([("pgd", 0.01, 10)])) == []


def test_diagnose_on_records_runs_every_check():
    r = pd.concat([records("clean", 0.0, [1] * 10, [None] * 10),
                   records("fgsm", 0.01, [1] * 5 + [0] * 5, [False] * 10),
                   records("pgd", 0.01, [1] * 8 + [0] * 2, [True] * 10),
                   records("pgd", 0.5, [1] * 9 + [0], [False] * 10),
                   records("pgd", 1.0, [1] * 3 + [0] * 7, [False] * 10).assign(condition="unconstrained")],
                  ignore_index=True)
    codes = sorted(f.code for f in diagnose(r))
    assert codes == ["eps-not-monotone", "pgd-above-fgsm", "unbounded-not-zero", "zero-gradients"]
    assert all(isinstance(f, Finding) and f.model == "m" and f.protocol == "standard" for f in diagnose(r))
    text = format_findings(diagnose(r))
    assert text.count("\n") == 4 and "zero-gradients" in text


def test_diagnose_clean_run_is_quiet():
    r = pd.concat([records("clean", 0.0, [1] * 10, [None] * 10),
                   records("fgsm", 0.01, [1] * 5 + [0] * 5, [False] * 10),
                   records("pgd", 0.01, [1] * 3 + [0] * 7, [False] * 10),
                   records("pgd", 0.5, [0] * 10, [False] * 10)], ignore_index=True)
    assert diagnose(r) == []
    assert "no gradient-masking signs" in format_findings([])


def test_checks_read_the_metadata_columns_not_the_attack_names():
    # attacks unknown to this installation: what they are comes only from the rows' columns
    meta = {"wb": dict(norm="linf", white_box=True, worst_case=True),
            "bb": dict(norm="linf", white_box=False, worst_case=True),
            "bb_l2": dict(norm="l2", white_box=False, worst_case=True),
            "rand": dict(norm="linf", white_box=False, worst_case=False)}
    t = tidy([("wb", 0.1, 40), ("bb", 0.1, 10), ("bb_l2", 0.1, 5), ("rand", 0.1, 1),
              ("wb", 0.3, 50), ("wb", 0.2, 30)])
    for col in ("norm", "white_box", "worst_case"):
        t[col] = [meta[a][col] for a in t["attack"]]
    t["attack_label"], t["paper_eps"] = t["attack"].str.upper(), float("nan")
    found = check_black_box(t)
    assert [(f.attack, f.eps, f.value) for f in found] == [("bb", 0.1, 30.0)]  # not the L2 one, not noise
    assert [(f.attack, f.eps) for f in check_eps_monotone(t)] == [("wb", 0.3)]


def test_pgd_and_fgsm_are_compared_on_the_samples_both_attacked():
    """FGSM on 8 samples and PGD on 24 (16 more, all robust): PGD is higher overall but lower on the 8 both
    attacked, so nothing is found; on the same samples a real PGD-above-FGSM still is."""
    fgsm = records("fgsm", 0.01, [1] * 3 + [0] * 5, [False] * 8)
    pgd = records("pgd", 0.01, [1] * 2 + [0] * 6 + [1] * 16, [False] * 24)
    assert check_pgd_vs_fgsm(pd.concat([fgsm, pgd], ignore_index=True)) == []
    worse = records("pgd", 0.01, [1] * 6 + [0] * 2 + [1] * 16, [False] * 24)
    (f,) = check_pgd_vs_fgsm(pd.concat([fgsm, worse], ignore_index=True))
    assert f.value == 37.5  # 6/8 against 3/8, not 22/24 against 3/8


def test_attack_moved_nothing_is_not_said_of_attacks_that_return_the_image_where_they_fail():
    """Square and AutoAttack return the clean image for samples they could not break: all-zero perturbations
    there mean "broke nothing", not masked gradients; a PGD that moved nothing is still an error."""
    from robustbench_pid.results.report.diagnostics import check_attack_moved

    def moved_nothing(attack, white_box):
        r = records(attack, 4 / 255, [1] * 8, [None] * 8)
        return r.assign(pert_linf=0.0, white_box=white_box, clean_pred=r.index % 3, label=r.index % 3)

    assert check_attack_moved(moved_nothing("square", False)) == []
    assert check_attack_moved(moved_nothing("autoattack", True)) == []
    (f,) = check_attack_moved(moved_nothing("pgd", True))
    assert f.code == "attack-moved-nothing" and f.severity == "error"


def test_no_signs_is_said_only_where_a_gradient_masking_check_could_run():
    from robustbench_pid.results.report.diagnostics import checks_that_apply

    aa_only = pd.concat([records("clean", 0.0, [1] * 10, [None] * 10),
                         records("autoattack", 4 / 255, [1] * 5 + [0] * 5, [None] * 10)], ignore_index=True)
    assert checks_that_apply(aa_only) == []
    text = format_findings(diagnose(aa_only), applied=checks_that_apply(aa_only))
    assert "no gradient-masking check could run" in text and "no gradient-masking signs" not in text
    sweep = pd.concat([records("fgsm", 0.01, [1] * 5 + [0] * 5, [False] * 10),
                       records("pgd", 0.01, [1] * 3 + [0] * 7, [False] * 10)], ignore_index=True)
    assert checks_that_apply(sweep) == ["pgd-above-fgsm", "zero-gradients"]
    assert format_findings([], applied=checks_that_apply(sweep)).endswith("(pgd-above-fgsm, zero-gradients)")
