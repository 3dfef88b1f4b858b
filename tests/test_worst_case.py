"""The derived worst-case-over-attacks row, from per-sample records."""
from __future__ import annotations

import pandas as pd
import pytest

from robustbench_pid.results.conditions import WORST_CASE
from robustbench_pid.results.summaries.adversarial import worst_case_records
from robustbench_pid.results.store import summarize

IDS = dict(run_id="r", model="m", checkpoint_sha256="abc", dataset="digits", protocol="standard",
           benchmark="adversarial")


def recs(attack, eps, top1, top5=None, params="{}", protocol="standard"):
    top5 = top1 if top5 is None else top5
    return pd.DataFrame([{**IDS, "protocol": protocol, "attack": attack, "eps": eps, "params": params,
                          "sample_id": str(i), "correct_top1": bool(a), "correct_top5": bool(b),
                          "attacked": True, "grad_zero": False}
                         for i, (a, b) in enumerate(zip(top1, top5))])


def rows(summary, attack=WORST_CASE, metric="top1"):
    return summary[(summary.attack == attack) & (summary.metric == metric)]


def test_worst_case_requires_surviving_every_attack():
    e = 4 / 255
    r = pd.concat([recs("clean", 0.0, [1, 1, 1, 1, 1]),
                   recs("fgsm", e, [1, 1, 0, 1, 1]),
                   recs("pgd", e, [1, 0, 1, 1, 1], top5=[1, 1, 1, 1, 1]),
                   recs("square", e, [1, 1, 1, 0, 1])], ignore_index=True)
    s = summarize(r)
    wc = rows(s)
    assert len(wc) == 1
    assert wc.value.iloc[0] == pytest.approx(40.0) and wc.n.iloc[0] == 5  # samples 0 and 4 survive all
    assert rows(s, metric="top5").value.iloc[0] == pytest.approx(60.0)
    assert wc["over"].iloc[0] == "fgsm+pgd+square"
    # never above any single attack
    singles = s[(s.metric == "top1") & s.attack.isin(["fgsm", "pgd", "square"])]
    assert (wc.value.iloc[0] <= singles.value).all()


def test_noise_and_other_norms_are_not_combined():
    r = pd.concat([recs("fgsm", 0.3, [1, 0, 1]), recs("noise", 0.3, [0, 1, 1]),
                   recs("pgd", 0.3, [1, 1, 0]), recs("sld", 0.3, [0, 0, 0]),
                   recs("pgd", 2 / 255, [0, 0, 0])], ignore_index=True)
    wc = worst_case_records(r)
    assert set(wc.eps) == {0.3}  # 2/255 has a single run; sld is L1, noise is not a worst case
    assert wc.correct_top1.tolist() == [True, False, False]
    assert wc["over"].iloc[0] == "fgsm+pgd"


def test_runs_of_one_attack_with_different_settings_are_combined():
    r = pd.concat([recs("pgd", 0.01, [1, 1, 0], params='{"steps": 10}'),
                   recs("pgd", 0.01, [0, 1, 1], params='{"steps": 100}')], ignore_index=True)
    s = summarize(r)
    assert rows(s).value.iloc[0] == pytest.approx(100 / 3)


def test_protocols_and_models_stay_separate():
    r = pd.concat([recs("fgsm", 0.01, [1, 1]), recs("pgd", 0.01, [1, 0]),
                   recs("fgsm", 0.01, [0, 1], protocol="paper"), recs("pgd", 0.01, [1, 1], protocol="paper")],
                  ignore_index=True)
    wc = rows(summarize(r))
    assert dict(zip(wc.protocol, wc.value)) == {"standard": 50.0, "paper": 50.0}
    assert len(wc) == 2


def test_only_samples_present_in_every_run_count():
    r = pd.concat([recs("fgsm", 0.01, [1, 1, 1, 1]), recs("pgd", 0.01, [1, 0])], ignore_index=True)
    wc = rows(summarize(r))
    assert wc.n.iloc[0] == 2 and wc.value.iloc[0] == 50.0


def test_no_worst_case_row_for_a_single_attack(tmp_path):
    s = summarize(pd.concat([recs("clean", 0.0, [1, 1]), recs("pgd", 0.01, [1, 0])], ignore_index=True))
    assert WORST_CASE not in set(s.attack)
