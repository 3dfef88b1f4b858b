"""A robustbench: model's published numbers beside the run's (issue 55 item 4): the pinned model_info table (its
source named, every entry of RobustBench's repository at the facts' commit), and the comparison's numbers checked
against hand-computed ones on hand-built records."""
from __future__ import annotations

import json
from importlib import resources

import pandas as pd
import pytest

from robustbench_pid.core import robustbench as rb
from robustbench_pid.results.summaries.leaderboard import compare, entry_of, format_leaderboard

EPS = 8 / 255


def test_the_pinned_table_is_robustbenchs_model_info_at_the_facts_commit() -> None:
    data = json.loads((resources.files("robustbench_pid.core") / "_data" / "robustbench_entries.json").read_text())
    assert data["source"]["commit"] == rb.facts()["source"]["commit"]
    assert data["source"]["generated_by"] == "scripts/robustbench_entries.py"
    assert len(data["entries"]) == 236  # the facts' own count of model_info files at that commit
    assert "236" in rb.facts()["source"]["read"]
    # RobustBench's own example of an entry an external evaluation corrected (the Xiao2020Enhancing)
    xiao = rb.published("cifar10", "Linf", "Xiao2020Enhancing")
    assert xiao["autoattack_acc"] == "18.50" and float(xiao["external"]) < 18.5 and xiao["unreliable"] is True
    assert rb.published("cifar10", "L2", "Standard")["eps"] == "0.5"
    assert rb.published("cifar10", "Linf", "NoSuchEntry") is None
    for key, e in data["entries"].items():
        dataset, threat, _ = key.split("/")
        assert dataset in ("cifar10", "cifar100", "imagenet") and threat in ("Linf", "L2", "corruptions")
        assert "clean_acc" in e


def test_entry_names() -> None:
    assert entry_of("robustbench:Ding2020MMA") == ("Linf", "Ding2020MMA")
    assert entry_of("robustbench:L2/Rony2019Decoupling") == ("L2", "Rony2019Decoupling")
    assert entry_of("pid_deit") is None


def _frames(aa, conv, model="robustbench:Ding2020MMA", norm="linf", attack="autoattack"):
    """Records of 10 samples: AutoAttack's and the ladder's per-sample verdicts as given, and their summary."""
    rec = []
    for i, (a, c) in enumerate(zip(aa, conv)):
        rec.append({"model": model, "attack": attack, "eps": EPS, "sample_id": f"test/{i}", "correct_top1": a,
                    "norm": norm})
        rec.append({"model": model, "attack": "converge", "eps": EPS, "sample_id": f"test/{i}", "correct_top1": c,
                    "norm": norm})
    base = {"model": model, "dataset": "cifar10", "metric": "top1", "n": len(aa), "norm": norm, "status": ""}
    summary = pd.DataFrame([
        {**base, "benchmark": "adversarial", "attack": "clean", "eps": 0.0, "value": 90.0},
        {**base, "benchmark": "adversarial", "attack": attack, "eps": EPS, "value": 100.0 * sum(aa) / len(aa)},
        {**base, "benchmark": "converge", "attack": "converge", "eps": EPS, "value": 100.0 * sum(conv) / len(conv),
         "status": "converged"}])
    return summary, pd.DataFrame(rec)


def test_the_paired_difference_is_autoattack_minus_converged_over_the_same_samples() -> None:
    aa = [True] * 6 + [False] * 4     # AutoAttack leaves 6 of 10
    conv = [True] * 3 + [False] * 7   # the ladder leaves 3 (samples 3-5 broken only by it)
    summary, records = _frames(aa, conv)
    (row,) = compare(summary, records)
    assert row["published"] == rb.published("cifar10", "Linf", "Ding2020MMA")
    assert (row["clean"], row["autoattack"], row["converged"]) == (90.0, 60.0, 30.0)
    assert (row["paired_n"], row["only_autoattack_robust"], row["only_converged_robust"]) == (10, 3, 0)
    assert row["difference"] == pytest.approx(30.0)
    # Bonett-Price by hand: pa = 1/12, pb = 4/12, d = 0.25, half = 1.96 sqrt((5/12 - 0.0625) / 12) = 0.33673
    assert row["difference_ci"] == pytest.approx((-8.673, 58.673), abs=0.01)
    assert row["pvalue"] == pytest.approx(0.25)  # exact McNemar, 3 vs 0
    assert row["comparable"] is False and "not run with --suite robustbench" in row["reasons"][0]
    text = format_leaderboard(summary, records)
    assert "published" in text and "41.44" in text and "+30.00 pt" in text and "not comparable" in text


def test_a_leaderboard_run_on_its_whole_sample_set_is_called_comparable_and_l2_uses_autoattack_l2() -> None:
    summary, records = _frames([True, False], [True, False], model="robustbench:L2/Standard", norm="l2",
                               attack="autoattack_l2")
    summary.loc[summary["attack"] == "autoattack_l2", "eps"] = 0.5
    summary.loc[summary["attack"] == "converge", "eps"] = 0.5
    records["eps"] = 0.5
    info = {"leaderboard": {"name": "robustbench", "eps": "0.5", "comparable": True, "reasons": []}}
    (row,) = compare(summary, records, info)
    assert row["threat"] == "L2" and row["published"]["eps"] == "0.5" and row["comparable"] is True
    assert row["difference"] == 0.0 and "comparable: this run is the leaderboard's protocol" in \
        format_leaderboard(summary, records, info)
    # a model that is no RobustBench entry gets no comparison
    other, rec = _frames([True], [True], model="pid_deit")
    assert compare(other, rec) == [] and format_leaderboard(other, rec) == ""
