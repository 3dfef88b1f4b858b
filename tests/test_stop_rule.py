"""The stop rule as docs/attacks.md states it: one test per sentence of the block between its ``stop-rule`` markers
(named after the sentence), on hand-made evidence tables for the verdict (``results/summaries/stop_rule.py``) and on
a fake rung runner for the rounds (``benchmarks/ladder/stop.py``); and the rule's own shape: at most 150 words, the
same text in the ladder's docstring, at most 12 settings, no constant justified by a grid sample."""
from __future__ import annotations

import re
import subprocess
from dataclasses import fields
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import pandas as pd
import pytest
import torch

import robustbench_pid.benchmarks.ladder as ladder_pkg
from robustbench_pid.benchmarks.ladder import Ladder, LadderSpec, Rung, RungResult, climb
from robustbench_pid.results.summaries.stop_rule import (BATCH_DEPENDENT, CONVERGED, MISLED, NOT_CONVERGED,
                                                         FRESH, MISS_RISK, RANDOM_OUTPUTS, UPPER_BOUND, near,
                                                         rivals, starts_for, tolerance, verdict)

ROOT = Path(__file__).resolve().parents[1]
EPS = 0.1


def rule_text() -> str:
    doc = (ROOT / "docs" / "attacks.md").read_text()
    m = re.search(r"<!-- stop-rule -->\n(.*?)\n<!-- /stop-rule -->", doc, re.S)
    assert m, "docs/attacks.md has no stop-rule block"
    return m.group(1)


def sentences() -> List[str]:
    return [s for s in re.split(r"(?<=\.)\s+(?=[A-Z])", " ".join(rule_text().split())) if s]


def table(n: int, **cols) -> pd.DataFrame:
    """An evidence table of ``n`` still-robust samples, nothing flagged, nothing near, nothing broken last."""
    base = {"robust": np.ones(n, bool), "no_gradient": np.zeros(n, bool), "misleads": np.zeros(n, bool),
            "left_gradient": np.full(n, 0.5), "left_free": np.full(n, 0.9), "full_gradient": np.zeros(n, bool),
            "full_free": np.zeros(n, bool), "last_broke": np.zeros(n, bool), "tau": np.full(n, 1 / 16),
            "rivals": np.zeros(n, bool), "edge": np.full(n, 1 / 64), "restarted": np.zeros(n, bool),
            "random": np.zeros(n, bool), "batch": np.zeros(n, bool)}
    base.update({k: np.asarray(v) for k, v in cols.items()})
    return pd.DataFrame(base)


def fake(breaks: Dict[str, int], margin_g: Optional[torch.Tensor] = None, margin_f: Optional[torch.Tensor] = None):
    """A rung runner that breaks the first ``breaks[rung id]`` samples it is given and reports the given verdict
    margins (clean margin 1, so they are shares) for the gradient families and for Square."""
    seen: List[Tuple[Rung, List[int]]] = []

    def run(rung: Rung, idx: torch.Tensor) -> RungResult:
        seen.append((rung, idx.tolist()))
        still = torch.ones(len(idx), dtype=torch.bool)
        still[:breaks.get(rung.id, 0)] = False
        m = margin_f if rung.kind == "free" else margin_g
        res = RungResult(still, torch.ones(len(idx)), torch.ones(len(idx)), None,
                         m[idx] if m is not None else None)
        if rung.family == "free":
            done = rung.resume[1] if rung.resume is not None else torch.zeros(len(idx))
            res.done, res.signs = done + rung.params["n_queries"], torch.zeros((len(idx), 1), dtype=torch.int8)
        return res
    return run, seen


def ladder(n: int) -> Ladder:
    return Ladder(robust=torch.ones(n, dtype=torch.bool), clean_margin=torch.ones(n))


def climbed(n: int, breaks: Dict[str, int], margin_g=None, margin_f=None, spec: Optional[LadderSpec] = None,
            **kw) -> Tuple[Ladder, List[Tuple[Rung, List[int]]]]:
    run, seen = fake(breaks, margin_g, margin_f)
    lad = climb(ladder(n), spec or LadderSpec(), EPS, run, unstable=kw.pop("unstable", False),
                no_grad=kw.pop("no_grad", torch.zeros(n, dtype=torch.bool)), **kw)
    return lad, seen


def test_the_rule_is_one_block_of_at_most_150_words_and_the_ladders_docstring_carries_it():
    text = rule_text()
    assert len(text.split()) <= 150
    assert " ".join(text.split()) in " ".join(ladder_pkg.__doc__.split())
    assert len(sentences()) == 7


def test_the_rule_has_at_most_12_settings_and_no_constant_named_after_a_grid_sample():
    assert len(fields(LadderSpec)) <= 12
    out = subprocess.run(["grep", "-rE", "cnn_at|deit|sample [0-9]+", str(ROOT / "robustbench_pid/benchmarks/ladder")],
                         capture_output=True, text=True)
    assert out.stdout == ""
    lines = sum(len(p.read_text().splitlines()) for p in (ROOT / "robustbench_pid/benchmarks/ladder").glob("*.py"))
    assert lines < 1225


def test_round_1_runs_apgd_t_on_9_ranked_targets_apgd_ce_and_square_on_every_still_robust_sample():
    """Sentence 1: APGD-T 12 iterations on each of 9 ranked targets, APGD-CE 100, Square 500 queries; each on the
    samples still robust after the rungs before it (FAB-T has no round-1 run)."""
    assert sentences()[0].startswith("Round 1 runs APGD-T 12 iterations x 9 targets, APGD-CE 100, Square 500 queries")
    lad, seen = climbed(200, {"apgd-t": 10, "apgd-ce": 5})
    first = [(r.id, r.describe().split(" (")[0], len(i)) for r, i in seen if r.round == 1]
    assert first == [("apgd-t", "APGD-T-12", 200), ("apgd-ce", "APGD-CE-100", 190), ("square", "Square-500", 185)]
    assert seen[0][0].params["targets"] == 9
    # no margins reported: nothing is near, and round 1 broke 15 > 1, so tau widens to 1: every sample
    assert lad.status == CONVERGED and lad.tau == 1.0


def test_a_sample_is_near_for_the_gradient_families_when_one_left_at_most_tau_and_for_square_when_it_did_or_came_nearer():
    """Sentence 2, on the pure function both the ladder and the verdict use."""
    assert sentences()[1].startswith("A sample is near at tau (first 1/16) for the gradient families")
    g = np.array([0.05, 0.07, 0.5, 0.5, np.inf])
    f = np.array([0.9, 0.9, 0.06, 0.4, 0.3])
    grad, free = near(g, f, 1 / 16)
    assert grad.tolist() == [True, False, False, False, False]
    assert free.tolist() == [False, False, True, True, True]  # within tau; nearer than the gradients (twice)
    assert all(m.all() for m in near(g, f, 1.0))  # tau 1: every sample
    # where Square is the gradient families' rival, every sample is near for Square, however far any search stayed
    assert near(g, f, 1 / 16, True)[1].tolist() == [True] * 5
    assert near(g, f, 1 / 16, np.array([True, False, False, True, False]))[1].tolist() == [True, False, True, True, True]
    robust = np.ones(5, bool)
    assert rivals(g, f, robust, 2) and not rivals(g, f, robust, 3)  # nearer on 3 samples: more than 2, not than 3
    assert not rivals(g, f, np.array([True, True, False, False, False]), 0)  # only still-robust samples count


def test_always_near_for_square_where_square_came_nearer_on_more_samples_than_the_tolerance():
    """Sentence 2's last clause on the ladder: one sample on which Square came nearer than the gradient families is
    more than the tolerance of 100 samples (0), so every still-robust sample gets Square's full budget, near or not
    (design 14); with a tolerance of 1 that one sample is within it, and only it does."""
    n = 100
    mg = torch.full((n,), 0.5)
    mg[:3] = 0.03
    mf = torch.full((n,), 0.9)
    mf[50] = 0.4
    lad, seen = climbed(n, {}, mg, mf)
    sq = [set(i) for r, i in seen if r.id == "square@2"]
    assert sq == [set(range(n))] and lad.rivals and lad.status == CONVERGED
    assert [r.params["n_queries"] for r, _ in seen if r.id == "square@2"] == [4500]
    assert bool(lad.evidence(torch.zeros(n, dtype=torch.bool), False, False, 1 / 64)["rivals"].all())
    lad, seen = climbed(n, {}, mg, mf, spec=LadderSpec(tol_min=1))
    assert [set(i) for r, i in seen if r.id == "square@2"] == [{50}] and not lad.rivals
    # the verdict reads the flag: a rival unit owes Square's budget to every still-robust sample, near or far
    ev = table(3, left_gradient=[0.03, 0.5, 0.5], left_free=[0.9, 0.9, 0.4], full_gradient=[True, False, False],
               full_free=[False, False, True])
    assert verdict(ev, 0)[0] == CONVERGED
    status, why = verdict(ev.assign(rivals=True), 0)
    assert status == NOT_CONVERGED and "2 near or edge still-robust sample(s) did not get" in why
    assert verdict(ev.assign(rivals=True, full_free=True), 0)[0] == CONVERGED
    assert verdict(ev.assign(rivals=True, robust=[True, False, True]), 0)[1].startswith("1 near or edge")


def test_each_later_round_gives_near_samples_each_familys_full_autoattack_budget_once():
    """Sentence 3: APGD-T and FAB-T 9 targets x 100 and Square continued to 5,000 queries on the near samples of
    their kind (APGD-CE spent its 100 in round 1), each sample once; tau starts at 1/16. A tolerance of 3 keeps
    Square from being the gradient families' rival (it came nearer on 3 samples)."""
    n = 100
    mg = torch.full((n,), 0.5)
    mg[:6] = 0.03  # near for the gradient families at 1/16
    mf = torch.full((n,), 0.9)
    mf[10:13] = 0.4  # Square came nearer than the gradients there (0.5): near for Square
    lad, seen = climbed(n, {"apgd-t@2": 4}, mg, mf, spec=LadderSpec(tol_min=3))
    later = {r.id: (r, i) for r, i in seen if r.round == 2}
    assert sorted(later) == ["apgd-t@2", "fab-t@2", "square@2"]
    assert set(later["apgd-t@2"][1]) == set(range(6)) and set(later["fab-t@2"][1]) == {4, 5}
    assert later["apgd-t@2"][0].params["steps"] == 100 and later["apgd-t@2"][0].params["targets"] == 9
    assert later["fab-t@2"][0].params["steps"] == 100 and later["fab-t@2"][0].params["targets"] == 9
    sq = later["square@2"][0]
    assert set(later["square@2"][1]) == {10, 11, 12} and sq.params["n_queries"] == 4500 and sq.resume is not None
    assert "Square +4500" in sq.describe() and "continuing each sample's run from its best point" in sq.describe()
    # round 2 broke 4 > 3: tau doubles past 1/8 and 1/4, where nothing new is near, to 1/2: the rest, each once
    rounds = [r.round for r, _ in seen]
    assert max(rounds) == 3 and lad.tau == 0.5 and not lad.rivals
    third = {r.id: set(i) for r, i in seen if r.round == 3}
    assert not (third["apgd-t@3"] & set(range(6))) and len(third["apgd-t@3"]) == 94  # 10-12 had only Square's
    assert "square@3" not in third  # Square's own evidence put no other sample near (0.9 > 1/2, not nearer)
    assert lad.status == "converged (reduced ladder (tol_min 3 > 0)" and LadderSpec().near == 1 / 16


def test_while_the_last_round_broke_more_than_the_tolerance_tau_doubles_up_to_every_sample():
    """Sentence 4: rounds at tau 1/16, 1/8, 1/4 ... while each broke more than the tolerance, 0.1% of n; a tau that
    adds no sample is skipped; after tau 1 (every sample) the ladder stops, not converged if that round still broke."""
    assert sentences()[3].startswith("While the last round broke over the tolerance, 0.1% of n,")
    spec = LadderSpec()
    assert [spec.tolerance(k) for k in (360, 999, 1000, 3000)] == [0, 0, 1, 3]
    assert tolerance(999, 0.001, 1) == 1  # a floor the user asks for (a reduced ladder)
    n = 100
    mg = torch.linspace(0.0, 0.99, n)  # share of the clean margin left: samples spread over every tau
    lad, seen = climbed(n, {"apgd-t@2": 3, "apgd-t@3": 3, "apgd-t@4": 3, "apgd-t@5": 3, "apgd-t@6": 3}, mg)
    taus = []
    for r in sorted({r.round for r, _ in seen if r.round > 1}):
        got = [i for rr, i in seen if rr.round == r and rr.id.startswith("apgd-t")][0]
        taus.append(float(mg[got].max()))
    assert [t <= b for t, b in zip(taus, (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0))] == [True] * 5
    assert lad.tau == 1.0 and lad.status == NOT_CONVERGED and "still broke 3" in lad.detail
    lad, seen = climbed(n, {"apgd-t@2": 3}, mg)  # the next round (tau 1/8) broke 0: stop there
    assert lad.tau == 1 / 8 and lad.status == CONVERGED and max(r.round for r, _ in seen) == 3


def test_then_edge_samples_within_1_64_for_the_gradient_families_or_square_get_those_budgets_afresh_up_to_6_times():
    """Sentence 5: after the near rounds, a still-robust sample the gradient families (or Square) left within 1/64 of
    its clean margin gets up to 6 more rounds of that kind's whole budgets, each a new run (APGD-T, APGD-CE's 100 and
    FAB-T; Square's 5,000 queries from a new start), until one breaks it; what they break neither widens tau nor counts
    as the last round; the verdict owes them otherwise. 6 is the fewest fresh starts that, with the full budget's run,
    keep p (1 - p)^s below 0.05 for every per-start share p."""
    assert sentences()[4] == ("Then edge samples, within 1/64 of their clean margin for the gradient families or "
                              "Square, get those budgets afresh, up to 6 times.")
    assert LadderSpec().edge == 1 / 64 and FRESH == 6 and starts_for(MISS_RISK) == 7 and MISS_RISK == 0.05
    assert 7 ** 7 / 8 ** 8 < 0.05 <= 6 ** 6 / 7 ** 7 and starts_for(4 / 27 + 1e-9) == 2  # the largest p (1 - p)^s
    n = 100
    mg = torch.full((n,), 0.5)
    mg[0], mg[1], mg[3] = 0.01, 0.03, 0.01  # 0 on the gradient families' edge, 1 only near, 3 on both edges
    mf = torch.full((n,), 0.9)
    mf[2], mf[3] = 0.012, 0.01  # 2 on Square's edge alone
    lad, seen = climbed(n, {"apgd-ce@4": 1}, mg, mf)
    fresh = [(r, set(i)) for r, i in seen if r.scope == "edge"]
    assert sorted({r.round for r, _ in fresh}) == list(range(3, 9))  # 6 fresh rounds after near round 2
    assert {r.id: i for r, i in fresh if r.round == 3} == {"apgd-t@3": {0, 3}, "apgd-ce@3": {0, 3}, "fab-t@3": {0, 3},
                                                             "square@3": {2, 3}}
    assert all(r.params.get("n_queries", 5000) == 5000 and r.resume is None and r.order is None for r, _ in fresh)
    assert [r.params["steps"] for r, _ in fresh if r.id == "apgd-ce@3"] == [100]
    assert {r.id for r, i in fresh if 0 in i} == {"apgd-t@3", "apgd-ce@3", "fab-t@3", "apgd-t@4", "apgd-ce@4"}
    assert sum(3 in i for r, i in fresh) == 24 and sum(2 in i for r, i in fresh) == 6  # 6 rounds x their kinds
    assert not any(1 in i for r, i in fresh)
    assert lad.tau == 1 / 16 and lad.status == CONVERGED and not bool(lad.last_broke.any())  # it broke 1 > 0
    assert lad.broken_by[0] == "apgd-ce@4" and lad.restarted.tolist()[:4] == [True, False, True, True]
    ev = lad.evidence(torch.zeros(n, dtype=torch.bool), False, False, 1 / 64)
    assert bool(ev["restarted"][2]) and float(ev["edge"][0]) == 1 / 64
    lad, seen = climbed(n, {"apgd-ce@3": 1, "square@3": 2}, mg, mf)  # every edge sample broke at its first
    assert max(r.round for r, _ in seen) == 3
    lad, seen = climbed(n, {}, mg, mf, spec=LadderSpec(edge=0))  # no edge: no fresh round, a reduced ladder
    assert max(r.round for r, _ in seen) == 2 and lad.status.startswith("converged (reduced ladder (edge 0 <")
    # the verdict: an edge sample without its fresh start is owed one, beyond the tolerance
    edge = table(3, left_gradient=[0.01, 0.5, 0.5], full_gradient=[True, False, False])
    status, why = verdict(edge, 0)
    assert status == NOT_CONVERGED and "1 near or edge still-robust sample(s)" in why
    assert verdict(edge.assign(restarted=[True, False, False]), 0)[0] == CONVERGED
    assert verdict(edge.assign(edge=0.0), 0)[0] == CONVERGED  # records of an earlier design: no edge


def test_converged_when_the_last_near_round_broke_at_most_the_tolerance_and_every_owed_budget_ran():
    """Sentence 6, on hand-made tables: the owed budgets are the near samples' full budgets and the edge samples'
    fresh starts (sentence 5's test has the latter)."""
    assert sentences()[5] == ("Converged: the last near round broke at most the tolerance and every owed budget "
                              "ran.")
    full = dict(left_gradient=[0.05, 0.5, 0.5], full_gradient=[True, False, False])
    assert verdict(table(3, **full), 1)[0] == CONVERGED
    assert verdict(table(3, **full, last_broke=[False, True, False]), 1)[0] == CONVERGED  # 1 <= tolerance 1
    status, why = verdict(table(3, **full, last_broke=[False, True, True], robust=[True, False, False]), 1)
    assert status == NOT_CONVERGED and "still broke 2" in why
    # near samples without their budget, beyond the tolerance
    status, why = verdict(table(3, left_gradient=[0.05, 0.01, 0.5], left_free=[0.9, 0.9, 0.3]), 1)
    assert status == NOT_CONVERGED and "3 near or edge still-robust sample(s) did not get" in why
    assert verdict(table(3), 1, ["steps 25 < 100"])[0] == "converged (reduced ladder (steps 25 < 100)"
    assert verdict(table(2, robust=[False, False]), 1) == (CONVERGED, "no sample is left robust")


def test_beyond_the_tolerance_no_usable_gradients_or_a_flagging_probe_make_an_upper_bound_random_or_batch_dependent_outputs_not_converged():
    """Sentence 7. Square coming nearer than the gradient families is no such evidence (it gets its full budget)."""
    assert sentences()[6].startswith("Beyond the tolerance: unusable gradients or a flagging probe")
    assert verdict(table(4, no_gradient=[True, True, False, False]), 1)[0] == UPPER_BOUND
    assert verdict(table(4, no_gradient=[True, False, False, False]), 1)[0] == CONVERGED
    assert verdict(table(4, misleads=[True, True, False, False]), 1)[0] == MISLED
    assert verdict(table(4, misleads=[True, True, False, False], robust=[False, False, True, True]), 1)[0] == CONVERGED
    nearer = table(4, left_gradient=[0.9] * 4, left_free=[0.5] * 4, full_free=[True] * 4)
    assert verdict(nearer, 1)[0] == CONVERGED
    assert verdict(table(4, random=[True] * 4), 1)[0] == RANDOM_OUTPUTS
    assert verdict(table(4, batch=[True] * 4), 1)[0] == BATCH_DEPENDENT
    # on the ladder: the probe's flag, not Square's nearness, is what says "gradients mislead"
    mg, mf = torch.full((50,), 0.9), torch.full((50,), 0.5)
    lad, _ = climbed(50, {}, mg, mf)
    assert lad.status == CONVERGED and bool(lad.full["free"].all())
    run, _ = fake({}, mg, mf)
    lad = ladder(50)
    lad.misleading[:2] = True
    lad = climb(lad, LadderSpec(), EPS, run, unstable=False, no_grad=torch.zeros(50, dtype=torch.bool))
    assert lad.status == MISLED and "the gradient probe flags 2" in lad.detail


def test_a_unit_and_its_condition_are_judged_by_the_same_function():
    """The condition's verdict reads the records' evidence columns with the condition's tolerance: three units that
    each converged on their own (each last round broke 1, tolerance 1) are together not converged."""
    from robustbench_pid.results.summaries.converge import condition_verdict

    rows = []
    for u in range(3):
        for i in range(300):
            rows.append({"unit": f"u{u}", "correct_top1": i >= 1, "grad_unavailable": False,
                         "converge_grad_misleads": False, "margin_clean": 1.0, "margin_gradient": 0.5,
                         "margin_free": 0.9, "converge_full_gradient": False, "converge_full_free": False,
                         "converge_last_broke": i == 0, "converge_tau": 1 / 16, "converge_unstable": False,
                         "converge_batch_dependent": False, "converge_status": CONVERGED, "converge_detail": "ok",
                         "params": '{"ladder": {"tol_share": 0.001, "tol_min": 1}}'})
    g = pd.DataFrame(rows)
    status, detail = condition_verdict(g)
    assert status == NOT_CONVERGED and "still broke 3" in detail and "3 of 3 work units converged" in detail
    assert condition_verdict(g[g["unit"] == "u0"])[0] == CONVERGED


def test_a_condition_reads_each_units_rival_flag_from_its_records():
    """``converge_rivals`` (design 12) enters the condition's evidence per unit: a unit where Square was a rival owes
    Square's budget to every still-robust sample (design 14); records without the column (design 11) owe none."""
    from robustbench_pid.results.summaries.converge import condition_verdict, evidence

    rows = [{"unit": "u0", "correct_top1": True, "grad_unavailable": False, "converge_grad_misleads": False,
             "margin_clean": 1.0, "margin_gradient": 0.03 if i < 2 else 0.5, "margin_free": 0.9,
             "converge_full_gradient": i < 2, "converge_full_free": i >= 5, "converge_last_broke": False,
             "converge_tau": 1 / 16, "converge_unstable": False, "converge_batch_dependent": False,
             "converge_rivals": True, "converge_status": CONVERGED, "converge_detail": "ok",
             "params": '{"ladder": {"tol_share": 0.001, "tol_min": 0}}'} for i in range(300)]
    g = pd.DataFrame(rows)
    assert bool(evidence(g)["rivals"].all())
    status, detail = condition_verdict(g)
    # the 2 the gradient families brought near and the 3 far ones without Square's 5,000 queries
    assert status == NOT_CONVERGED and "5 near or edge still-robust sample(s) did not get" in detail
    assert condition_verdict(g.drop(columns="converge_rivals"))[0] == CONVERGED


def test_a_condition_reads_each_units_edge_share_and_fresh_starts_from_its_records():
    """``converge_edge`` and ``converge_restarted`` (design 13) enter the condition's evidence: a sample on the edge
    without its fresh start is owed one; records without the columns (design 12 and before) owe none."""
    from robustbench_pid.results.summaries.converge import condition_verdict, evidence

    rows = [{"unit": "u0", "correct_top1": True, "grad_unavailable": False, "converge_grad_misleads": False,
             "margin_clean": 2.0, "margin_gradient": 0.02 if i == 0 else 1.0, "margin_free": 1.8,
             "converge_full_gradient": i == 0, "converge_full_free": False, "converge_last_broke": False,
             "converge_tau": 1 / 16, "converge_unstable": False, "converge_batch_dependent": False,
             "converge_rivals": False, "converge_edge": 1 / 64, "converge_restarted": False,
             "converge_status": CONVERGED, "converge_detail": "ok",
             "params": '{"ladder": {"tol_share": 0.001, "tol_min": 0}}'} for i in range(300)]
    g = pd.DataFrame(rows)
    assert evidence(g)["edge"].tolist() == [1 / 64] * 300
    status, detail = condition_verdict(g)  # 0.02 / 2.0 = 1% of the clean margin: on the edge, no fresh start
    assert status == NOT_CONVERGED and "1 near or edge still-robust sample(s)" in detail
    assert condition_verdict(g.assign(converge_restarted=[True] + [False] * 299))[0] == CONVERGED
    assert condition_verdict(g.drop(columns=["converge_edge", "converge_restarted"]))[0] == CONVERGED
