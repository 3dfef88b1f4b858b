"""The convergence ladder (--converge) on tiny models: rung order, only-robust samples attacked, the
stop rule, the status values, models built to fool a plain attack, a randomised model, resume.

The models are small MLPs on scikit-learn's 8x8 digits (trained in a second), so the whole ladder runs
in seconds on a CPU; the ladder's budgets are cut with --converge-opt where that keeps a test fast."""
from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import robustbench_pid as rbp
from robustbench_pid.benchmarks.ladder import Ladder, LadderSpec, Rung, RungResult, climb
from robustbench_pid.errors import UserError
from robustbench_pid.results.summaries.converge import (CONVERGED, NOT_CONVERGED, RANDOM_OUTPUTS, REDUCED, RUNG_ORDER,
                                                        UPPER_BOUND)

EPS = 0.1
# a cut-down ladder for tests that do not read its status (its status says "reduced ladder")
FAST = {"steps": 25, "sweep_steps": 6, "fab_steps": 10, "square_queries": 100, "eot_steps": 10, "eot_iter": 4, "spsa_iterations": 5,
        "spsa_samples": 16}


class Scaled(torch.nn.Module):
    """Logits x 1e4: the same predictions, cross-entropy saturates (its gradients vanish)."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * 1e4


class _Cut(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return torch.zeros_like(g)


class Cut(Scaled):
    """The same forward pass; the input gradient is zero (a gradient-masking defence's signature)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(_Cut.apply(x))


class Dropout(Scaled):
    """A randomised model: dropout left on at evaluation (functional, so eval() does not turn it off)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(torch.nn.functional.dropout(x, 0.3, training=True))


def converge(model, digits8, tmp_path: Path, name: str, n: int = 64, fast: bool = False, **kw):
    """The ladder on the tiny MLP: the default ladder (seconds on these models), or ``fast`` (a reduced one)."""
    x, y = digits8
    opts = {**(FAST if fast else {}), **kw.pop("opt", {})}
    df = rbp.evaluate(model=model, data=(x[:n], y[:n]), attack="pgd", eps=EPS, steps=10, converge=True,
                      converge_opt=opts, out=tmp_path / name, name=name, mean=[0.0], std=[1.0], **kw)
    rec = rbp.load_records(df.attrs["run_dir"])
    return df, rec[rec["benchmark"] == "converge"].reset_index(drop=True)


@pytest.fixture(scope="module")
def plain_run(plain, digits8, tmp_path_factory):
    return converge(plain, digits8, tmp_path_factory.mktemp("plain"), "plain")


def converged_row(df: pd.DataFrame) -> pd.Series:
    return df[(df["benchmark"] == "converge") & (df["metric"] == "top1")].iloc[0]


def test_plain_model_ladder_order_scope_and_status(plain_run):
    df, rec = plain_run
    rungs = rec["converge_rungs"].iloc[0].split(",")
    assert rungs[0] == "user" and rungs == sorted(rungs, key=RUNG_ORDER.index)
    # every round runs the four families: CE gradient, targeted margin, boundary, gradient-free
    assert {"apgd-ce", "apgd-t", "fab-t", "square"} <= set(rungs)
    # rung 0 is the user's row, read (design 9): it breaks every sample the row breaks (here exactly those: no
    # walk crossed back) and makes no walk of its own: at most one verdict pass, at a first top-1 break the row's
    # final point no longer shows
    adv = rbp.load_records(df.attrs["run_dir"])
    row_pgd = adv[adv["attack"] == "pgd"].set_index("sample_id")
    pgd = row_pgd["correct_top1"]
    rung0 = rec.set_index("sample_id")["rung0_correct_top1"]
    assert (rung0 <= pgd.loc[rung0.index]).all() and (rung0 == pgd.loc[rung0.index]).all()
    assert (rec["bwd@user"] == 0).all() and (rec["fwd@user"] <= 1).all() and row_pgd["passes_backward"].mean() > 1
    user = json.loads(rec["converge_history"].iloc[0])[0]
    assert user["id"] == "user" and user["settings"].startswith("PGD-10") and "first top-1 break" in user["settings"]
    # each later rung attacked only samples still robust after the rungs before it
    pos = {r: i for i, r in enumerate(RUNG_ORDER)}
    broken_at = rec["broken_by"].map(lambda r: pos[r] if r else 99)
    for r in rungs[1:]:
        hit = pd.to_numeric(rec.get(f"fwd@{r}"), errors="coerce").fillna(0) > 0
        assert (broken_at[hit] >= pos[r]).all(), r
        assert rec["clean_correct_top1"][hit].all()
    # the curve never rises, ends at the converged value; the user's number is above it
    row = converged_row(df)
    curve = df[(df["benchmark"] == "converge") & (df["metric"] == "rung_top1")]
    assert list(curve["rung"]) == rungs
    assert (np.diff(curve["value"].to_numpy()) <= 1e-9).all()
    assert curve["value"].iloc[-1] == pytest.approx(row["value"])
    pgd_row = df[(df["attack"] == "pgd") & (df["metric"] == "top1")].iloc[0]
    gap = df[df["metric"] == "converge_gap"]["value"].iloc[0]
    assert gap == pytest.approx(pgd_row["value"] - row["value"]) and gap >= 0
    assert row["status"] == CONVERGED
    rounds = [int(r) for r in rec["converge_rounds"].iloc[0].split(",")]
    broke = [int(b) for b in rec["converge_broke"].iloc[0].split(",")]
    last_round = sum(b for b, r in zip(broke, rounds) if r == max(rounds))
    assert last_round <= rec["converge_tolerance"].iloc[0]
    # the worst-case point of each sample is in the records: broken ones within eps, robust ones the clean image
    broken = rec["clean_correct_top1"].astype(bool) & ~rec["correct_top1"].astype(bool)
    assert broken.any() and (rec.loc[broken, "pert_linf"] <= EPS + 1e-6).all() and (rec.loc[broken, "pert_linf"] > 0).all()
    assert (rec.loc[rec["correct_top1"].astype(bool), "pert_linf"] == 0).all()
    assert (rec["passes_backward"] >= 0).all() and rec["passes_forward"].mean() > 0


def test_scaled_logits_converge_near_plain(plain, plain_run, digits8, tmp_path):
    df_p, _ = plain_run
    df_s, rec = converge(Scaled(copy.deepcopy(plain)), digits8, tmp_path, "scaled")
    pgd = df_s[(df_s["attack"] == "pgd") & (df_s["metric"] == "top1")].iloc[0]["value"]
    plain_v, scaled_v = converged_row(df_p)["value"], converged_row(df_s)["value"]
    assert pgd > scaled_v + 20  # CE-based PGD is fooled by the scaling ...
    assert abs(scaled_v - plain_v) <= 5  # ... the ladder's DLR rung is not
    assert converged_row(df_s)["status"] == CONVERGED
    assert not rec["grad_unavailable"].any()  # DLR gradients exist: not "gradient-free"


def test_cut_gradients_are_an_upper_bound_never_converged(plain, plain_run, digits8, tmp_path):
    df_p, _ = plain_run
    df_c, rec = converge(Cut(copy.deepcopy(plain)), digits8, tmp_path, "cut")
    row = converged_row(df_c)
    assert row["status"] == UPPER_BOUND or abs(row["value"] - converged_row(df_p)["value"]) <= 5
    assert row["status"] != CONVERGED
    rungs = rec["converge_rungs"].iloc[0].split(",")
    assert "square" in rungs and "spsa" in rungs  # the gradient-free rungs ran on their own
    assert "gradients" in row["status_detail"]


def test_randomised_model_gets_the_eot_rungs(plain, digits8, tmp_path):
    model = Dropout(copy.deepcopy(plain))
    _, rec = converge(model, digits8, tmp_path, "dropout", n=32, fast=True)
    rungs = rec["converge_rungs"].iloc[0].split(",")
    assert "eot-ce" in rungs and "eot-dlr" in rungs
    assert bool(rec["converge_unstable"].iloc[0])
    # each verdict is one draw of a random forward pass: no converged value, and not mistaken for batch dependence
    assert set(rec["converge_status"]) == {RANDOM_OUTPUTS} and not rec["converge_batch_dependent"].any()
    _, rec_p = converge(plain, digits8, tmp_path, "plain32", n=32, fast=True)
    assert "eot-ce" not in rec_p["converge_rungs"].iloc[0] and not rec_p["converge_unstable"].iloc[0]


def test_resume_after_an_interrupted_run_gives_the_same_records(plain, digits8, tmp_path):
    _, rec = converge(plain, digits8, tmp_path, "resume", n=48, chunk_size=16, fast=True)
    out = tmp_path / "resume"
    units = sorted(p for p in (out / "units").glob("*.parquet")
                   if pd.read_parquet(p, columns=["benchmark"])["benchmark"].iloc[0] == "converge")
    assert len(units) == 3  # one per chunk of 16
    for p in units[:2]:  # as if killed before these two units were written
        p.with_suffix(".json").unlink()
        p.unlink()
    (out / "summary.csv").unlink()
    _, again = converge(plain, digits8, tmp_path, "resume", n=48, chunk_size=16, fast=True)
    cols = [c for c in rec.columns if c not in ("unit",)]
    pd.testing.assert_frame_equal(rec[cols], again[cols])


def _ladder(n: int) -> Ladder:
    return Ladder(robust=torch.ones(n, dtype=torch.bool))


def _fake(breaks: dict, nearness=None, free=None):
    """A rung runner that breaks the first ``breaks[rung]`` of the samples it is given (``nearness``: per sample,
    what the ranked APGD-T reports as its best margin loss; ``free``: what Square reports)."""
    seen = []

    def run(rung: Rung, idx: torch.Tensor):
        seen.append((rung.id, idx.tolist()))
        k = breaks.get(rung.id, 0)
        still = torch.ones(len(idx), dtype=torch.bool)
        still[:k] = False
        near = nearness[idx] if nearness is not None and rung.family == "targeted" else None
        near = free[idx] if free is not None and rung.family == "free" else near
        res = RungResult(still, torch.ones(len(idx)), torch.ones(len(idx)), None, near)
        if rung.family == "free":  # Square's state to continue from, as the real one reports it
            res.done = (rung.resume[1] if rung.resume is not None else torch.zeros(len(idx))) + rung.params["n_queries"]
            res.signs = torch.zeros((len(idx), 1, 1, 1), dtype=torch.int8)
        return res
    return run, seen


ROUND1 = ["apgd-t", "apgd-ce", "fab-t", "square"]


def test_a_round_that_breaks_at_most_the_tolerance_ends_the_ladder_and_every_family_runs_first():
    spec = LadderSpec()
    none = torch.zeros(1000, dtype=torch.bool)
    run, seen = _fake({"apgd-t": 1})
    lad = climb(_ladder(1000), spec, EPS, run, unstable=False, no_grad=none)
    # one round of the four families breaking 1 <= max(1, 0.1% of 1000) stops; gradient rungs alone never do
    assert [s[0] for s in seen] == ROUND1 and lad.status == CONVERGED and "round 1" in lad.detail
    # only still-robust samples reach a later rung
    run, seen = _fake({"apgd-t": 10, "apgd-ce": 5})
    lad = climb(_ladder(1000), spec, EPS, run, unstable=False, no_grad=none)
    assert [s[0] for s in seen][:4] == ROUND1
    assert len(seen[1][1]) == 990 and len(seen[2][1]) == 985 and set(seen[1][1]).isdisjoint(range(10))
    # round 1 broke 15 > 1: round 2 attacks the 20% still-robust samples nearest the boundary, and breaks nothing;
    # FAB-T and Square go back only where they were closing in, Square also where the gradients mislead, and to
    # their own nearest after they broke a sample (none of that here: they reported no margins and broke nothing)
    assert [s[0] for s in seen][4:] == ["apgd-t@2", "apgd-ce@2"]
    assert len(seen[4][1]) == 197 and lad.status == CONVERGED and "round 2" in lad.detail


def test_the_gradient_free_rung_breaking_more_than_the_tolerance_keeps_the_ladder_climbing():
    """The adversarially trained model the issue met: the gradient rungs break nothing more, Square breaks 2."""
    spec = LadderSpec()
    none = torch.zeros(200, dtype=torch.bool)
    run, seen = _fake({"apgd-t": 1, "square": 2})
    lad = climb(_ladder(200), spec, EPS, run, unstable=False, no_grad=none)
    assert [s[0] for s in seen][:7] == ROUND1 + ["apgd-t@2", "apgd-ce@2", "square@2"]  # FAB-T broke nothing
    assert lad.status == CONVERGED and int((~lad.robust).sum()) == 3


def test_later_rounds_attack_the_nearest_samples_and_name_the_last_round_when_they_run_out():
    near = torch.arange(100, dtype=torch.float32) % 7  # the samples with nearness 6 come first
    spec = LadderSpec.from_options({"tol_share": 0.0, "near_min": 1})
    run, seen = _fake({r: 3 for r in RUNG_ORDER}, near)
    lad = climb(_ladder(100), spec, EPS, run, unstable=False, no_grad=torch.zeros(100, dtype=torch.bool))
    ids = [s[0] for s in seen]
    assert ids == ROUND1 + [f"{r}@2" for r in ROUND1] + [f"{r}@3" for r in ROUND1]
    round2 = dict(seen)["apgd-t@2"]
    assert len(round2) == 18 and all(int(near[i]) >= 5 for i in round2)  # ceil(20% of the 88 left), nearest first
    assert lad.status == NOT_CONVERGED and "round 3, the last (3 allowed), still broke 12" in lad.detail


def test_each_family_goes_back_to_the_samples_its_own_evidence_puts_nearest_and_square_to_the_misled_ones():
    """Square's later runs go to the samples Square came nearest on, the gradient families' to those APGD-T came
    nearest on; and Square also takes every sample on which its short search matched the gradient attacks'
    margin (their gradients mislead there), however far from the boundary both were."""
    n = 100
    grad = torch.linspace(-0.1, -0.9, n)  # APGD-T: sample 0 nearest
    free = torch.full((n,), -5.0)
    free[90:] = torch.linspace(-0.3, -0.2, 10)  # Square: 99 nearest; and 90-99 at least as near as APGD-T got
    free[50] = -0.45  # APGD-T came to -0.50 on 50: Square nearer, though far from Square's nearest: misled
    free[40] = -0.40  # and to -0.42 on 40: misled too
    spec = LadderSpec.from_options({"near_min": 1})
    run, seen = _fake({"apgd-t": 5}, grad, free)
    lad = climb(_ladder(n), spec, EPS, run, unstable=False, no_grad=torch.zeros(n, dtype=torch.bool))
    scope = dict(seen)
    nearest = set(range(5, 5 + 19))  # ceil(20% of the 95 left) by APGD-T's margin, after the 5 it broke
    assert set(scope["apgd-t@2"]) == nearest and set(scope["apgd-ce@2"]) == nearest
    misled = {i for i in range(5, n) if free[i] >= grad[i]}
    assert {40, 50} <= misled and not (misled & set(range(5, 40)))
    by_square = set(torch.argsort(free[5:], descending=True, stable=True)[:19].add(5).tolist())
    assert set(scope["square@2"]) == misled  # Square broke nothing in round 1: not its own nearest (design 6)
    run, seen = _fake({"apgd-t": 5, "square": 1}, grad, free)  # it broke the first sample it attacked, 5
    lad = climb(_ladder(n), spec, EPS, run, unstable=False, no_grad=torch.zeros(n, dtype=torch.bool))
    by_square = set(torch.argsort(free[6:], descending=True, stable=True)[:19].add(6).tolist())
    assert set(dict(seen)["square@2"]) == by_square | misled
    assert bool(lad.misled()[40]) and not bool(lad.misled()[6])


def test_no_gradient_samples_get_spsa_and_a_randomised_model_the_eot_rungs():
    spec = LadderSpec()
    no_grad = torch.zeros(50, dtype=torch.bool)
    no_grad[10:20] = True
    run, seen = _fake({})
    lad = climb(_ladder(50), spec, EPS, run, unstable=True, no_grad=no_grad)
    ids = [s[0] for s in seen]
    assert ids[:2] == ["eot-ce", "eot-dlr"] and ids.index("spsa") > ids.index("square")
    assert dict(seen)["spsa"] == list(range(10, 20))
    assert lad.status == UPPER_BOUND


def test_round_one_sweeps_every_ranked_target_briefly_and_later_rounds_go_deep_on_the_next_ranks():
    """Round 1's APGD-T runs all ``pool`` ranked classes for ``sweep_steps`` iterations each (a break ranked 3rd
    to 6th is not left to a later round on a subset); rounds 2 and 3 run ranks 1-3 and 4-6 at ``steps`` each."""
    spec = LadderSpec()
    run, seen = _fake({"apgd-t": 50, "apgd-t@2": 20})
    lad = climb(_ladder(1000), spec, EPS, run, unstable=False, no_grad=torch.zeros(1000, dtype=torch.bool))
    targeted = [h["settings"] for h in lad.history if h["family"] == "targeted"]
    assert targeted == ["APGD-T-12 (targets 1-9 of 9 ranked by boundary distance)",
                        "APGD-T-100 (targets 1-3 of 9 ranked by boundary distance)",
                        "APGD-T-100 (targets 4-6 of 9 ranked by boundary distance)"]
    assert lad.status == CONVERGED and "round 3" in lad.detail
    with pytest.raises(UserError, match="3 deep rounds of 4 ranked targets need 12 candidates but pool is 9"):
        LadderSpec.from_options({"rounds": 4, "targets": 4})


def test_square_continues_each_samples_search_doubling_its_queries_and_never_past_its_cap():
    """Design 7: 500 queries in round 1; each later run continues the sample's search from its best point for as
    many queries again (500 more, then 1,000 more: AutoAttack's one run in pieces, no fresh starts repeating the large
    early squares), only where Square's evidence sends it (here: its own nearest, after it broke a sample)."""
    spec = LadderSpec()

    def runs(breaks, spec=spec, free=torch.linspace(0, 1, 1000)):  # Square's own nearest: the same samples each round
        run, seen = _fake(breaks, free=free)
        lad = climb(_ladder(1000), spec, EPS, run, unstable=False, no_grad=torch.zeros(1000, dtype=torch.bool))
        return [h["settings"].split(" (")[0].split(",")[0] for h in lad.history if h["family"] == "free"], lad, seen

    got, lad, seen = runs({"apgd-t": 50, "square": 1, "apgd-t@2": 20, "square@2": 1})
    assert got == ["Square-500", "Square +500", "Square +1000"], got
    assert all("continuing each sample's run from its best point" in h["settings"] for h in lad.history
               if h["family"] == "free" and h["round"] > 1)
    attacked = [set(i) for r, i in seen if r == "square@3"][0]
    assert {int(lad.square_done[i]) for i in attacked} == {2000}  # 500 + 500 + 1,000 on each sample it went on with
    # Square broke nothing and was nowhere closing in or misled: it has no later run (its scope is empty)
    got, lad, seen = runs({"apgd-t": 50, "apgd-t@2": 20}, free=None)
    assert [r for r, i in seen if r.startswith("square") and i] == ["square"]
    # never past Square's cap per sample, AutoAttack's 5,000 queries (the fake runner charged 1 + 1 before)
    got, _, _ = runs({"apgd-t": 50, "square": 1, "apgd-t@2": 20, "square@2": 3},
                     LadderSpec.from_options({"square_growth": 4}))
    assert got == ["Square-500", "Square +1500", "Square +4998"], got


def test_a_reduced_ladder_says_so_in_its_status_and_rung_settings():
    spec = LadderSpec.from_options({"steps": 1, "sweep_steps": 2, "targets": 1})
    assert spec.reductions() == ["steps 1 < 100", "sweep_steps 2 < 12", "targets 1 < 3"]
    run, _ = _fake({})
    lad = climb(_ladder(100), spec, EPS, run, unstable=False, no_grad=torch.zeros(100, dtype=torch.bool))
    assert lad.status == f"{REDUCED} (steps 1 < 100, sweep_steps 2 < 12, targets 1 < 3)" and lad.status != CONVERGED
    assert [h["settings"] for h in lad.history][:2] == ["APGD-T-2 (targets 1-9 of 9 ranked by boundary distance)",
                                                        "APGD-CE-1"]
    looser = LadderSpec.from_options({"tol_share": 0.01})
    assert looser.reductions() == ["tol_share 0.01 > 0.001"]
    assert LadderSpec.from_options({"square_queries": 5000, "rounds": 4}).reductions() == []  # stronger: not reduced


def test_converge_refuses_what_it_cannot_do(plain, digits8, tmp_path):
    x, y = digits8
    with pytest.raises(UserError, match="standard protocol only"):
        rbp.evaluate(model="deit", attack="pgd", eps="4/255", limit=4, converge=True, protocol="paper")
    with pytest.raises(UserError, match="L-inf or L2 worst-case attack"):  # an L1 attack: no L1 rungs
        rbp.evaluate(model="deit", attack="sld", eps=2, limit=4, converge=True)
    with pytest.raises(UserError, match="add --converge"):
        rbp.evaluate(model="deit", attack="pgd", eps="4/255", limit=4, converge_tol=0.01)
    with pytest.raises(UserError, match="converge-opt"):
        rbp.evaluate(model="deit", attack="pgd", eps="4/255", limit=4, converge=True, converge_opt={"bogus": 1})
    # a stop rule that is no stop rule, or a setting that is not a number, is refused where it enters
    for kw, needle in ((dict(converge_tol=0.5), r"share in \[0, 0.05\]"), (dict(converge_tol=False), "expected a share"),
                       (dict(converge_tol=float("nan")), "share in"),
                       (dict(converge_opt={"tol_min": 1000}), r"tol_min must be in \[0, 10\]"),
                       (dict(converge_opt={"unstable_rtol": float("nan")}), "unstable_rtol must be a finite"),
                       (dict(converge_opt={"unstable_rtol": -1}), "unstable_rtol must be a finite"),
                       (dict(converge_tol=0.01, converge_opt={"tol_share": 0.02}), "given twice")):
        with pytest.raises(UserError, match=needle):
            rbp.evaluate(model="deit", attack="pgd", eps="4/255", limit=4, converge=True, **kw)


def test_converge_names_the_attacks_it_gives_no_converged_value(capsys):
    from robustbench_pid.cli import main

    assert main(["evaluate", "--model", "deit", "--attack", "pgd", "--attack", "noise", "--eps", "4/255", "--limit",
                 "4", "--converge", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "note: --converge: no converged value for noise: the ladder escalates the L-inf and L2 worst-case attacks" in err


def test_check_fails_on_a_lower_converged_value_or_a_status_change(plain_run, tmp_path):
    from robustbench_pid.results.ci.check import check, update

    df, _ = plain_run
    run_dir = df.attrs["run_dir"]
    base = tmp_path / "baseline.csv"
    update(run_dir, base)
    assert check(run_dir, base).ok
    b = pd.read_csv(base)
    conv = (b["attack"] == "converge") & (b["metric"] == "top1")
    assert conv.sum() == 1 and b.loc[conv, "status"].iloc[0] == CONVERGED
    # the curve, the ladder's cost and the gap are evidence, shown but not gated: a cheaper ladder is no regression
    assert not {"rung_top1", "converge_gap", "converge_passes_forward", "converge_passes_backward"} & set(b["metric"])
    old = pd.concat([b, b[conv].assign(metric="converge_passes_forward", value=1e6)])  # made before they were not gated
    old.to_csv(base, index=False)
    assert check(run_dir, base).ok
    up = b.copy()
    up.loc[conv, "value"] += 10.0  # the baseline's converged value was higher: now a regression
    up.to_csv(base, index=False)
    res = check(run_dir, base)
    assert not res.ok and set(res.failures["metric"]) == {"top1"} and set(res.failures["attack"]) == {"converge"}
    st = b.copy()
    st.loc[conv, "status"] = UPPER_BOUND
    st.to_csv(base, index=False)
    res = check(run_dir, base)
    assert not res.ok and list(res.failures["status"]) == ["STATUS-CHANGED"]
    assert "status: upper bound: gradients unavailable → converged" in res.report()


def test_terminal_table_plot_and_report_section(plain_run, tmp_path):
    from robustbench_pid.results.report.evidence_report import converge_section
    from robustbench_pid.results.report.plots import figures
    from robustbench_pid.results.summaries.converge import format_converge

    df, rec = plain_run
    text = format_converge(df)
    row = converged_row(df)
    assert f"converged robust top-1 {row['value']:.2f}%" in text and "status: converged:" in text
    assert "your attack" in text and "APGD-T" in text and "above the converged one" in text
    bound = df.copy()
    bound.loc[bound["benchmark"] == "converge", "status"] = NOT_CONVERGED
    text = format_converge(bound)  # a ladder that did not converge is not called converged anywhere
    assert f"robust top-1, an upper bound (not converged): {row['value']:.2f}%" in text
    assert "converged robust" not in text and "above the ladder's" in text
    figs, _ = figures(df.attrs["run_dir"])
    ax = figs["convergence"].axes[0]
    ys = ax.lines[0].get_ydata()
    assert ys[-1] == pytest.approx(row["value"]) and len(ys) == len(rec["converge_rungs"].iloc[0].split(","))
    assert "Converged robust accuracy" in converge_section(df)


def test_reproduce_converge_rows_and_why_others_get_none():
    from robustbench_pid.studies.reproduce import converge_eligible
    from robustbench_pid.studies.spec import load_study

    study = load_study("digits-smoke")
    got = {r.name: converge_eligible(r) for r in study.rows}
    assert {k for k, (ok, _) in got.items() if ok} == {"fgsm-2", "fgsm-4", "pgd-2", "pgd-4"}
    assert "not an attack row" in got["clean"][1] and "noise" in got["noise"][1] and "L1" in got["sld"][1]


def _script(name: str):
    """One of scripts/*.py, imported as a module."""
    import importlib.util
    import sys

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location(name, root / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _bench():
    return _script("bench_converge")


def test_the_converge_docs_block_is_the_rendering_of_the_committed_bench_runs(tmp_path, monkeypatch):
    """docs/attacks.md's converge block comes from scripts/bench_converge.py --render over docs/runs/converge;
    a hand-edited number makes --check fail."""
    bench = _bench()
    assert bench.main(["--check"]) == 0
    text = bench.doc.DOC.read_text()
    body = text.split(bench.doc.BEGIN, 1)[1].split(bench.doc.END, 1)[0]
    row = next(line for line in body.splitlines() if line.startswith("| deit |"))
    edited = tmp_path / "attacks.md"
    edited.write_text(text.replace(row, row.replace("| converged |", "| not converged |", 1), 1))
    monkeypatch.setattr(bench.doc, "DOC", edited)
    assert bench.main(["--check"]) == 1
    # every bench row's criteria are stated, and the table says which of the 360 x 1..6/255 cells ran
    assert "criteria" in body and "<= AA" in body and ("grid ran" in body or "not yet run" in body
                                                      or "run on fewer images so far" in body)


def test_bench_seconds_count_only_the_units_the_run_plans(tmp_path):
    """A 120-image run resumed into a 360-image one keeps the smaller layout's unit files: its seconds are not
    the larger run's; without unit files (they are not committed), run.json's compute_seconds."""
    bench = _bench()
    run = tmp_path / "autoattack"
    (run / "units").mkdir(parents=True)
    unit = {"benchmark": "adversarial", "attack": "autoattack", "eps": 8 / 255}
    for key, seconds in (("planned", 40.0), ("stale", 3000.0)):
        (run / "units" / f"{key}.json").write_text(json.dumps({**unit, "seconds": seconds}))
    (run / "plan.json").write_text(json.dumps({"units": [{"key": "planned"}]}))
    (run / "run.json").write_text(json.dumps({"compute_seconds": 77.0}))
    assert bench._unit_seconds(run, "adversarial", "autoattack", 8 / 255) == 40.0
    for f in (run / "units").iterdir():
        f.unlink()
    assert bench._unit_seconds(run, "adversarial", "autoattack", 8 / 255) == 77.0


def test_bench_cell_chunk_size_cuts_new_runs_into_units_and_reuses_finished_ones(tmp_path):
    """--chunk-size: a cell's new runs are cut into units of that many samples (a killed run keeps the finished
    ones); a finished run is reused as it is, whatever chunk size a later call names."""
    import json

    bench = _bench()
    row = bench.measure("deit", "32/255", 6, tmp_path, "cpu", chunk_size=3)
    cell = bench.cell_dir(tmp_path, "deit", "32/255")
    for run in ("converge", "autoattack"):
        plan = json.loads((cell / run / "plan.json").read_text())
        assert plan["n_units"] > 1 and {u["stop"] - u["start"] for u in plan["units"]} == {3}
    assert int(row["n"].iloc[0]) == 6 and row[["ladder_chunk", "aa_chunk", "ref_block"]].iloc[0].tolist() == [3, 3, 3]
    assert bench.doc._chunking(row) == [
        "Cut into work units (`--chunk-size`, so that a killed run keeps what it finished; each unit or block draws "
        "its own random starts): deit 32/255: the ladder in units of 3, AutoAttack in units of 3, the reference in "
        "blocks of 3. The other runs each ran in one unit."]
    before = {p: p.stat().st_mtime_ns for p in cell.rglob("records.parquet")}
    again = bench.measure("deit", "32/255", 6, tmp_path, "cpu", chunk_size=5)
    assert {p: p.stat().st_mtime_ns for p in cell.rglob("records.parquet")} == before
    assert float(again["converged"].iloc[0]) == float(row["converged"].iloc[0])


def test_bench_reference_in_blocks_resumes_at_its_first_unfinished_block(tmp_path, monkeypatch):
    """The reference ensemble cut into blocks writes each finished block; a re-run loads those and attacks only
    the missing ones, with the same per-block seeds, so the result equals an uninterrupted run."""
    bench = _bench()
    monkeypatch.setattr(bench, "REFERENCE", {"apgd_strong": {"steps": 5, "restarts": 1, "loss": "ce"},
                                             "square": {"n_queries": 10}})
    ids = [str(s) for s in rbp.load_dataset("digits", split="test").sample_ids[:5]]
    aa = pd.DataFrame({"sample_id": ids, "correct_top1": [True, True, False, True, True]})
    parts = tmp_path / "parts"
    whole = bench.reference("deit", aa, 8 / 255, 5, "cpu", block=2, parts=parts)
    assert sorted(p.name for p in parts.iterdir()) == ["block-0-of-2.csv", "block-1-of-2.csv"]
    assert whole.loc[2, "extra_forward"] == 0 and (whole.loc[[0, 1, 3, 4], "extra_forward"] > 0).all()
    (parts / "block-1-of-2.csv").unlink()
    attacked = []
    real = bench._attack_block
    monkeypatch.setattr(bench, "_attack_block", lambda m, ds, out, members, *a: (attacked.append(members),
                                                                                 real(m, ds, out, members, *a)))
    resumed = bench.reference("deit", aa, 8 / 255, 5, "cpu", block=2, parts=parts)
    assert attacked == [[3, 4]]
    pd.testing.assert_frame_equal(resumed, whole)
    (parts / "block-0-of-2.csv").write_text((parts / "block-0-of-2.csv").read_text().replace(ids[0], ids[2]))
    with pytest.raises(SystemExit, match="other samples than its block"):
        bench.reference("deit", aa, 8 / 255, 5, "cpu", block=2, parts=parts)


def test_bench_reference_blocks_are_shared_by_claims_and_the_last_process_assembles(tmp_path, monkeypatch):
    """A block another live process holds is left to it: this process attacks the free blocks and gets None
    back; once the held block is written, the next call attacks nothing and assembles the same result."""
    import json
    import os
    import shutil

    from robustbench_pid.results.files.run_files import HOST, proc_start

    bench = _bench()
    monkeypatch.setattr(bench, "REFERENCE", {"apgd_strong": {"steps": 5, "restarts": 1, "loss": "ce"},
                                             "square": {"n_queries": 10}})
    ids = [str(s) for s in rbp.load_dataset("digits", split="test").sample_ids[:5]]
    aa = pd.DataFrame({"sample_id": ids, "correct_top1": [True, True, False, True, True]})
    whole = bench.reference("deit", aa, 8 / 255, 5, "cpu", block=2, parts=tmp_path / "whole")
    parts = tmp_path / "parts"
    parts.mkdir()
    holder = os.getppid()  # a live process other than this one
    (parts / "block-0-of-2.claim").write_text(json.dumps({"host": HOST, "pid": holder, "pid_start": proc_start(holder),
                                                          "token": "other"}))
    attacked = []
    real = bench._attack_block
    monkeypatch.setattr(bench, "_attack_block", lambda m, ds, out, members, *a: (attacked.append(members),
                                                                                 real(m, ds, out, members, *a)))
    assert bench.reference("deit", aa, 8 / 255, 5, "cpu", block=2, parts=parts) is None
    assert attacked == [[3, 4]] and (parts / "block-0-of-2.claim").is_file()
    (parts / "block-0-of-2.claim").unlink()
    shutil.copy(tmp_path / "whole" / "block-0-of-2.csv", parts / "block-0-of-2.csv")  # what the holder wrote
    attacked.clear()
    pd.testing.assert_frame_equal(bench.reference("deit", aa, 8 / 255, 5, "cpu", block=2, parts=parts), whole)
    assert attacked == []


def _deit_study(tmp_path: Path) -> Path:
    """A study folder holding the committed claims-digits DeiT column (paper protocol and converged runs)."""
    import shutil

    src = Path(__file__).resolve().parents[1] / "docs" / "runs" / "claims-digits"
    out = tmp_path / "study"
    out.mkdir()
    shutil.copy(src / "study.toml", out / "study.toml")
    shutil.copytree(src / "deit@DeiT", out / "deit@DeiT")
    return out


def test_study_converged_cell_that_did_not_converge_reads_as_an_upper_bound(tmp_path):
    """A study's converged column shows the ladder's value; where its status is not "converged" the cell says it
    is an upper bound and a note names the row and the status."""
    from robustbench_pid.studies.table import render_markdown, study_cells

    out = _deit_study(tmp_path)
    study, cells, notes = study_cells(out)
    conv = [c for c in cells if c.protocol == "converged, standard" and c.value is not None]
    assert {c.row for c in conv} == {f"pgd-{e}" for e in range(1, 7)} and {c.status for c in conv} == {CONVERGED}
    assert "upper bound" not in render_markdown(study, cells, notes)
    summary = out / "deit@DeiT" / "converged" / "pgd-4" / "summary.csv"
    s = pd.read_csv(summary)
    s.loc[s["benchmark"] == "converge", "status"] = "not converged"
    s.to_csv(summary, index=False)
    study, cells, notes = study_cells(out)
    cell = next(c for c in cells if c.protocol == "converged, standard" and c.row == "pgd-4" and c.metric == "top1")
    assert cell.status == "not converged"
    text = render_markdown(study, cells, notes)
    assert text.count("(upper bound: not converged)") == 1
    assert any("row 'pgd-4'" in n and "'not converged'" in n and "upper bound" in n for n in notes)
    # the CSV says it too, and a converged value (pixel eps, standard protocol) is not differenced against the
    # published paper-protocol number: another threat model
    from robustbench_pid.studies.table import render_csv

    csv = pd.read_csv(io.StringIO(render_csv(study, cells)))
    row = csv[(csv["protocol"] == "converged, standard") & (csv["row"] == "pgd-4") & (csv["metric"] == "top1")].iloc[0]
    assert row["status"] == "not converged" and pd.isna(row["diff"]) and pd.isna(row["outside"])
    assert all(c.diff is None and c.outside is None for c in cells if c.converged)
    assert "no difference or * (another threat model)" in " ".join(text.split())  # the legend wraps at 200 columns
    s.loc[s["benchmark"] == "converge", "status"] = "upper bound: gradients unavailable"
    s.to_csv(summary, index=False)
    study, cells, notes = study_cells(out)
    text = render_markdown(study, cells, notes)
    assert "(upper bound: gradients unavailable)" in text and "upper bound: upper bound" not in text


def test_rows_whose_eps_is_no_pixel_budget_get_no_converged_column():
    """The papers' SPSA eps 0.1 is a budget on the normalised tensor; read in pixels it is 25.5/255, beyond any
    image threat model, so that row gets no converged value (and says why); PGD at 4/255 gets one."""
    from robustbench_pid.studies.reproduce import converge_eligible
    from robustbench_pid.studies.spec import load_study

    rows = {r.name: r for r in load_study("pidformer-table1").rows}
    ok, why = converge_eligible(rows["spsa"])
    assert not ok and "25.5/255" in why and "beyond any image threat model" in why
    assert converge_eligible(rows["pgd"]) == (True, "")


def test_overestimate_warning_points_to_the_ladder_only_where_it_converged():
    """The default output's one-line warning: without a ladder it points to --converge; with one it says to report
    the converged values only where the ladder converged at that eps, and calls the rest upper bounds."""
    from robustbench_pid.results.report.evidence_text import overestimate_note

    def rows(*extra):
        base = [{"model": "m", "benchmark": "adversarial", "attack": "pgd", "eps": 4 / 255, "norm": "linf",
                 "metric": "incomplete_optimization", "value": 20.0, "setting": "PGD-20"}]
        return pd.DataFrame(base + [dict(r) for r in extra])

    ladder = {"model": "m", "benchmark": "converge", "attack": "converge", "eps": 4 / 255, "norm": "linf",
              "metric": "top1", "value": 10.0, "status": CONVERGED}
    assert overestimate_note(rows()).endswith("run again with --converge for a converged value (L-inf and L2 attacks; "
                                              "docs/attacks.md)")
    assert overestimate_note(rows(ladder)).endswith("the converged values above are the ones to report")
    note = overestimate_note(rows({**ladder, "status": NOT_CONVERGED}))
    assert "did not converge for 1 of them (not converged)" in note and "upper bounds too" in note
    assert "ones to report" not in note
    l2 = {"model": "m", "benchmark": "adversarial", "attack": "pgd_l2", "eps": 4 / 255, "norm": "l2",
          "metric": "incomplete_optimization", "value": 5.0, "setting": "PGD-L2"}
    note = overestimate_note(rows(ladder, l2))
    assert "in 2 condition(s)" in note and "1 of them have no converged value" in note
    assert overestimate_note(rows({**ladder, "eps": 2 / 255})).endswith("for a converged value (L-inf and L2 attacks; "
                                                                        "docs/attacks.md)")


class NaNAway(Scaled):
    """Finite logits on the clean images, NaN once an input moves off them: argmax of an all-NaN row is class 0,
    which would count every class-0 sample as robust."""

    def __init__(self, net: torch.nn.Module, clean: torch.Tensor) -> None:
        super().__init__(net)
        self.clean = clean

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.net(x)
        moved = ~(x[:, None] == self.clean[None]).flatten(2).all(2).any(1)
        return torch.where(moved[:, None], torch.full_like(z, float("nan")), z)


def test_a_rung_whose_model_gives_nan_stops_instead_of_counting_class_0_as_robust(plain, digits8):
    from robustbench_pid.benchmarks.ladder import Rung, run_rung
    from robustbench_pid.runtime.health import NonFiniteError

    x, y = digits8
    x, y = x[:12], y[:12]
    model = NaNAway(plain, x)
    assert torch.isfinite(model(x)).all()
    rung = Rung("apgd-ce", "apgd_ce", {"eps": EPS, "steps": 5}, "ce")
    with pytest.raises(NonFiniteError, match="non-finite logits in the ladder's rung 'apgd-ce'"):
        run_rung(rung, model, model, x, y, torch.Generator().manual_seed(0), 12)
    seen = []

    def runner_check(t: torch.Tensor, stage: str) -> None:  # the runner passes check_finite with its context
        seen.append(stage)
        if not torch.isfinite(t).all():
            raise RuntimeError("runner's check")

    with pytest.raises(RuntimeError, match="runner's check"):
        run_rung(rung, model, model, x, y, torch.Generator().manual_seed(0), 12, check=runner_check)
    assert seen == ["attack", "verdict"]


def test_a_damaged_entry_file_is_one_error_and_converged_columns_come_after_the_protocols(tmp_path):
    from robustbench_pid.errors import UserError
    from robustbench_pid.studies.table import study_cells

    out = _deit_study(tmp_path)
    _, cells, _ = study_cells(out)
    assert list(dict.fromkeys(c.protocol for c in cells)) == ["paper", "converged, standard"]
    (out / "deit@DeiT" / "entry.json").write_text('{"model": "de')
    with pytest.raises(UserError, match="entry.json is damaged \\(not JSON\\); run reproduce for that model again"):
        study_cells(out)


def _unit_records(units, tol_share=0.001, tol_min=1):
    """Converge records of one condition: per unit (rungs, broke, robust flags, gradient-free flags)."""
    import json

    params = json.dumps({"ladder": {**LadderSpec().as_dict(), "tol_share": tol_share, "tol_min": tol_min}})
    rows = []
    for u, (rungs, broke, robust, gradless) in enumerate(units):
        for i, (r, g) in enumerate(zip(robust, gradless)):
            rows.append({"unit": f"u{u}", "sample_id": f"{u}-{i}", "params": params, "correct_top1": r,
                         "grad_unavailable": g, "converge_status": CONVERGED, "converge_detail": "d",
                         "converge_rungs": ",".join(rungs), "converge_broke": ",".join(map(str, broke))})
    return pd.DataFrame(rows)


def test_the_condition_level_rule_sees_what_small_units_leave_to_their_last_rung():
    """Each unit's ladder stops on its own tolerance (1 sample); three units whose last full rungs each broke one
    sample left 3 of the condition's 360 to it, more than its tolerance of 1: not converged. A unit with nothing
    left robust counts 0, and robust samples without gradients beyond the condition's tolerance make it an upper
    bound even if no unit saw more than one."""
    from robustbench_pid.results.summaries.converge import condition_detail, condition_status, last_full_breaks

    ok = [True] * 119 + [False]
    rungs = ["user", "apgd-ce", "apgd-t"]
    each_one = _unit_records([(rungs, [5, 0, 1], ok, [False] * 120)] * 3)
    assert last_full_breaks(each_one) == 3 and condition_status(each_one) == NOT_CONVERGED
    assert "3 of 3 work units converged; their last rounds broke 3 of 360 samples (tolerance 1" in \
        condition_detail(each_one)
    one = _unit_records([(rungs, [5, 0, 1], ok, [False] * 120)] + [(rungs, [5, 0, 0], ok, [False] * 120)] * 2)
    assert condition_status(one) == CONVERGED
    emptied = _unit_records([(rungs + ["spsa"], [5, 0, 1, 0], ok, [False] * 120)] +
                            [(rungs, [120, 0, 3], [False] * 120, [False] * 120)] * 2)  # nothing left: counts 0
    assert last_full_breaks(emptied) == 1 and condition_status(emptied) == CONVERGED
    gradless = _unit_records([(rungs, [5, 0, 0], ok, [True] + [False] * 119)] * 3)
    assert condition_status(gradless) == UPPER_BOUND


def test_rung0_draws_as_the_users_row_when_some_samples_are_not_attacked(plain, digits8, tmp_path):
    """Samples wrong at clean top-5 are not attacked; rung 0 must still draw the random starts of the attacked
    rows as the adversarial unit did, so its verdicts (and the gap) are the user's row's."""
    x, y = digits8
    x, y = x[:32], y[:32].clone()
    with torch.no_grad():
        least = plain(x).argmin(1)
    y[:5] = least[:5]  # the model's least likely class: wrong at top-5
    df = rbp.evaluate(model=plain, data=(x, y), attack="pgd", eps=EPS, steps=1, converge=True, converge_opt=FAST,
                      out=tmp_path / "r", name="r", mean=[0.0], std=[1.0])
    rec = rbp.load_records(df.attrs["run_dir"])
    pgd = rec[rec["attack"] == "pgd"].set_index("sample_id")["correct_top1"]
    lad = rec[rec["benchmark"] == "converge"].set_index("sample_id")
    # equal verdicts (a start drawn for another row would differ both ways; a walk stopped at its first top-1
    # break could only break more)
    assert (lad["rung0_correct_top1"] == pgd.loc[lad.index]).all()
    c1 = int(lad["clean_correct_top1"].astype(bool).sum())
    assert c1 < 32 and int(lad["converge_attacked"].iloc[0].split(",")[0]) == c1  # rung 0 attacks the top-1 correct
    gap = df[df["metric"] == "converge_gap"]["value"].iloc[0]
    pgd_v = df[(df["attack"] == "pgd") & (df["metric"] == "top1")]["value"].iloc[0]
    assert gap == pytest.approx(pgd_v - converged_row(df)["value"])


def test_cut_gradients_in_one_sample_units_are_still_an_upper_bound(plain, digits8, tmp_path):
    """With one sample per work unit no unit sees more gradient-free samples than its tolerance of 1; the
    condition does, so it is not reported converged at the user's PGD value."""
    df, rec = converge(Cut(copy.deepcopy(plain)), digits8, tmp_path, "cut1", n=16, chunk_size=1)
    assert converged_row(df)["status"] == UPPER_BOUND and rec["grad_unavailable"].sum() > 1


def test_the_ladder_savings_block_is_the_rendering_of_the_committed_measurements(tmp_path, monkeypatch):
    """docs/attacks.md's per-rung savings (AutoAttack's setting against the ladder's on the same samples) come from
    scripts/ladder_savings.py over docs/runs/savings; an edited number makes --check fail."""
    mod = _script("ladder_savings")
    assert mod.main(["--check"]) == 0
    text = mod.DOC.read_text()
    body = text.split(mod.BEGIN, 1)[1].split(mod.END, 1)[0]
    edited = tmp_path / "attacks.md"
    edited.write_text(text.replace(body, body + "\n| an edited line |\n", 1))
    monkeypatch.setattr(mod, "DOC", edited)
    assert mod.main(["--check"]) == 1


def test_ladder_savings_only_re_measures_the_named_rungs_and_keeps_the_rest_in_order(tmp_path, monkeypatch):
    """``--only RUNG``: the cell's other rows stay as measured, the new rows take their places in the variant order,
    and a cell measured on other samples is refused (its rows would not compare)."""
    mod = _script("ladder_savings")

    def rows(rungs, broke, attacked=10):
        return pd.DataFrame([{"model": "m", "eps": "4/255", "n": 40, "attacked": attacked, "rung": r, "variant": v,
                              "broke": broke, "fwd_per_attacked": 1.0, "bwd_per_attacked": 1.0, "seconds": 1.0,
                              "broken_ids": ""} for r, v, _, _ in mod.VARIANTS if r in rungs])

    monkeypatch.setattr(mod, "OUT", tmp_path)
    rows(("APGD-T", "FAB-T", "Square"), 1).to_csv(tmp_path / "m@4-255.csv", index=False)
    monkeypatch.setattr(mod, "measure", lambda m, e, limit, only: rows(only, 2))
    assert mod.main(["--model", "m", "--eps", "4/255", "--only", "FAB-T"]) == 0
    got = pd.read_csv(tmp_path / "m@4-255.csv")
    assert list(got["variant"]) == [v for _, v, _, _ in mod.VARIANTS]
    assert got.set_index("rung")["broke"].groupby(level=0).max().to_dict() == {"APGD-T": 1, "FAB-T": 2, "Square": 1}
    monkeypatch.setattr(mod, "measure", lambda m, e, limit, only: rows(only, 2, attacked=11))
    with pytest.raises(SystemExit):
        mod.main(["--model", "m", "--eps", "4/255", "--only", "Square"])
    assert pd.read_csv(tmp_path / "m@4-255.csv").equals(got)


def test_a_curve_follows_the_order_its_ladder_ran_and_an_earlier_design_says_so():
    """A condition's curve accumulates robust accuracy and passes in the order its records say the rungs ran (an
    earlier design ran APGD-CE before APGD-T); the design that made a record is read from its params."""
    import json

    from robustbench_pid.results.summaries.converge import DESIGN, curve, ladder_design, run_order

    def records(rungs, broken_by):
        return pd.DataFrame({"sample_id": [str(i) for i in range(4)], "clean_correct_top1": True,
                             "converge_rungs": ",".join(rungs), "broken_by": broken_by,
                             "fwd@apgd-ce": [100.0] * 4, "fwd@apgd-t": [10.0, 10.0, 117.0, 117.0]})

    old = records(["user", "apgd-ce", "apgd-t"], ["", "apgd-ce", "apgd-t", ""])
    assert run_order(old)[:4] == ["user", "probe", "apgd-ce", "apgd-t"]
    c = curve(old).set_index("rung")
    assert c.loc["apgd-ce", "value"] == 75.0 and c.loc["apgd-t", "value"] == 50.0  # of 4: APGD-CE broke 1, then APGD-T 1
    assert c.loc["apgd-ce", "passes_forward_cum"] == 100.0 and c.loc["apgd-t", "passes_forward_cum"] == 163.5
    new = records(["user", "apgd-t", "apgd-ce"], ["", "apgd-ce", "apgd-t", ""])
    c = curve(new).set_index("rung")
    assert list(c.index) == ["user", "apgd-t", "apgd-ce"]
    assert c.loc["apgd-t", "value"] == 75.0 and c.loc["apgd-t", "passes_forward_cum"] == 63.5
    ladder = LadderSpec().as_dict()
    assert ladder_design(json.dumps({"ladder": {k: v for k, v in ladder.items() if k != "sweep_steps"}})) == 1
    assert ladder_design(json.dumps({"ladder": ladder})) == 2
    assert ladder_design(json.dumps({"ladder": ladder, "design": DESIGN})) == DESIGN
    assert ladder_design("not json") == 0


def _closing_fake(square, breaks=None):
    """A rung runner whose Square reports per-sample search progress: ``square(round, idx) -> (best, half)`` verdict
    margins; the gradient rungs report a near, stalled margin (0.01, no gain: nearer than Square gets, so their
    gradients are trusted). Square's forward passes are its queries."""
    seen = []

    def run(rung: Rung, idx: torch.Tensor):
        seen.append((rung.id, idx.tolist()))
        still = torch.ones(len(idx), dtype=torch.bool)
        if rung.family == "free":
            best, half = square(rung.round, idx)
            still = best > 0
            fwd = torch.full((len(idx),), float(rung.params["n_queries"]))
        else:
            best, half = torch.full((len(idx),), 0.01), torch.full((len(idx),), 0.01)
            fwd = torch.ones(len(idx))
        res = RungResult(still, fwd, torch.ones(len(idx)), None, None, best, half)
        if rung.family == "free":
            res.done = (rung.resume[1] if rung.resume is not None else torch.zeros(len(idx))) + rung.params["n_queries"]
            res.signs = torch.zeros((len(idx), 1, 1, 1), dtype=torch.int8)
        return res
    return run, seen


def test_a_search_still_closing_in_gets_more_budget_until_it_breaks_and_only_where_it_closes_in():
    """The issue's adversarially trained CNN: Square's best margin on two samples fell from 0.62 / 0.90 after 500
    queries to 0.04 / 0.14 after 1,000, where design 4 stopped; the others sat far away and barely moved. Design 5
    reads the progress: the two get Square again (continuation rounds, nothing else runs) until they break."""
    n = 200

    def square(r, idx):
        best = torch.full((len(idx),), 3.0)
        half = best + 0.05  # far, and the last half gained 0.05 < 3.0 / 4: stalled
        for j, i in enumerate(idx.tolist()):
            if i in (0, 1):
                best[j], half[j] = {1: (0.62 + 0.28 * i, 1.0 + 0.3 * i), 2: (0.04 + 0.1 * i, 0.3 + 0.1 * i),
                                    3: (-0.2, 0.1)}[r]
        return best, half

    run, seen = _closing_fake(square)
    lad = climb(_ladder(n), LadderSpec(), EPS, run, unstable=False, no_grad=torch.zeros(n, dtype=torch.bool))
    later = [(rid, ids) for rid, ids in seen if "@" in rid]
    assert later == [("square@2", [0, 1]), ("square@3", [0, 1])]  # only Square, only where it closed in
    assert [h["settings"].split(" (")[0] for h in lad.history if h["family"] == "free"] == \
        ["Square-500", "Square +500", "Square +1000"]  # design 7: each run continues the last, 1,000 then 2,000 in all
    assert not lad.robust[0] and not lad.robust[1] and int(lad.robust.sum()) == n - 2
    assert lad.status == CONVERGED and "further round(s)" in lad.detail
    assert [h.get("kind") for h in lad.history][-1] == "continue"


def test_a_family_still_closing_in_when_its_cap_is_spent_is_not_converged():
    """Never breaking, always gaining a third of what is left: at Square's cap (AutoAttack's 5,000 queries per sample)
    the search was still closing in on 3 samples: not converged, naming the family."""
    n = 100

    def square(r, idx):
        best = torch.full((len(idx),), 3.0)
        half = best.clone()
        for j, i in enumerate(idx.tolist()):
            if i < 3:
                best[j] = 0.5 ** r
                half[j] = best[j] * 1.5
        return best, half

    run, seen = _closing_fake(square)
    lad = climb(_ladder(n), LadderSpec(), EPS, run, unstable=False, no_grad=torch.zeros(n, dtype=torch.bool))
    queries = [h["settings"].split(" (")[0] for h in lad.history if h["family"] == "free"]
    # design 7: each run continues the last: 500, 1,000, 2,000, 4,000 in all, then 5,000 (the cap)
    assert queries == ["Square-500", "Square +500", "Square +1000", "Square +2000", "Square +1000"]
    assert lad.status == NOT_CONVERGED and "still closing in on 3" in lad.detail and "free" in lad.detail
    assert int(lad.robust.sum()) == n


def test_gradients_that_a_random_search_beats_or_a_gradient_step_probe_flags_make_an_upper_bound():
    """Gradient trust: the random search coming nearer than every gradient rung on more than the tolerance of the
    samples left robust, or the probe's flag (a gradient step no better than a random one), makes the number an
    upper bound whatever the rounds broke; one such sample (the tolerance) does not."""
    from robustbench_pid.results.summaries.converge import MISLED

    n = 100
    for nearer, flagged, want in ((2, 0, MISLED), (0, 2, MISLED), (1, 0, CONVERGED), (0, 1, CONVERGED)):
        def square(r, idx, k=nearer):
            best = torch.full((len(idx),), 6.0)
            best[idx < k] = 0.005  # nearer than the gradient rungs' 0.01
            return best, best.clone()

        lad = _ladder(n)
        lad.misleading[50:50 + flagged] = True
        run, _ = _closing_fake(square)
        climb(lad, LadderSpec(), EPS, run, unstable=False, no_grad=torch.zeros(n, dtype=torch.bool))
        assert lad.status == want, (nearer, flagged, lad.status)
        assert int(lad.untrusted().sum()) == nearer + flagged


def test_the_condition_sums_untrusted_gradients_and_searches_still_closing_in_over_its_units():
    """Design 5 at condition level: one untrusted (or still closing-in) robust sample per unit is within each unit's
    tolerance, but three over the condition's 360 samples are more than its tolerance of 1: the condition is an
    upper bound (gradients mislead), or not converged; the detail says why. A continuation round's breaks after the
    last full round are not the stop rule's (they are judged by exhaustion)."""
    from robustbench_pid.results.summaries.converge import (MISLED, condition_detail, condition_status,
                                                            last_full_breaks)

    ok = [True] * 119 + [False]
    rungs = ["user", "apgd-t", "apgd-ce", "fab-t", "square"]
    for col, want in (("converge_untrusted", MISLED), ("converge_closing", NOT_CONVERGED)):
        g = _unit_records([(rungs, [5, 0, 0, 0, 0], ok, [False] * 120)] * 3)
        g[col] = [i % 120 == 0 for i in range(len(g))]
        assert condition_status(g) == want and "3 still-robust samples with" in condition_detail(g)
        g[col] = [i == 0 for i in range(len(g))]
        assert condition_status(g) == CONVERGED
    cont = _unit_records([(rungs + ["square@2"], [5, 0, 0, 0, 0, 2], ok, [False] * 120)] * 3)
    cont["converge_rounds"] = "0,1,1,1,1,2"
    assert last_full_breaks(cont) == 6  # without the round kinds: round 2 is the last
    cont["converge_full_round"] = 1
    assert last_full_breaks(cont) == 0 and condition_status(cont) == CONVERGED


def test_the_bar_prices_the_ladder_so_it_never_sits_at_its_end_while_the_ladder_runs(plain, digits8, tmp_path,
                                                                                       monkeypatch):
    """Issue 56 item 6: design 4's bar reached 100% once rung 0 was done (the whole unit's planned work was charged
    per sample of rung 0) and sat there for the rest of the ladder. Now each rung's batch advances it by the passes
    it spent, each round makes room for its planned passes as it is decided, and the bar is at its end for at most a
    fifth of the converge unit's time (measured on the bar's own updates: when it first reached its total)."""
    import time

    import tqdm.auto

    seen = []

    class Watched(tqdm.auto.tqdm):  # type: ignore[misc,valid-type]
        def update(self, n=1):
            out = super().update(n)
            seen.append((time.perf_counter(), float(self.n), float(self.total or 0)))
            return out

    monkeypatch.setattr(tqdm.auto, "tqdm", Watched)
    x, y = digits8
    rbp.evaluate(model=copy.deepcopy(plain), data=(x[:64], y[:64]), attack="pgd", eps=EPS, steps=10, converge=True,
                 out=tmp_path / "bar", name="bar", mean=[0.0], std=[1.0], progress=True)
    assert len(seen) > 10  # every rung's batches moved it, not one jump per unit
    start, end = seen[0][0], seen[-1][0]
    full = next(t for t, n, total in seen if total and n >= total - 1e-6)
    assert (end - full) <= 0.2 * (end - start), (full - start, end - start)
    assert all(n <= total + 1e-6 for _, n, total in seen)


def test_continuation_rounds_take_the_next_ranked_targets_from_rank_1_again_and_the_settings_are_checked():
    from robustbench_pid.benchmarks.ladder import planned_round

    spec = LadderSpec()
    firsts = [(r.params["first"], r.params["targets"]) for k in range(2, 8)
              for r in planned_round(spec, EPS, k, False, False, 500) if r.family == "targeted"]
    assert firsts == [(1, 3), (4, 3), (7, 3), (1, 3), (4, 3), (7, 3)]  # the pool of 9, then from rank 1 again
    odd = LadderSpec.from_options({"pool": 8, "targets": 3})
    assert [(r.params["first"], r.params["targets"]) for k in (2, 3, 4)
            for r in planned_round(odd, EPS, k, False, False, 500) if r.family == "targeted"] == [(1, 3), (4, 3),
                                                                                              (7, 2)]
    with pytest.raises(UserError, match="rounds \\+ continue_rounds must be at most 9"):
        LadderSpec.from_options({"continue_rounds": 7})
    with pytest.raises(UserError, match="lookahead must be a finite number >= 0"):
        LadderSpec.from_options({"lookahead": -1})
    # a smaller cap or lookahead is a weaker ladder: its converged says so
    assert LadderSpec.from_options({"cap_free": 1000, "lookahead": 2}).reductions() == ["lookahead 2 < 4",
                                                                                       "cap_free 1000 < 5000"]


def test_a_restart_that_only_walks_back_to_where_the_family_had_been_is_no_progress():
    """Every Square run gains within itself (a fresh start: twice its final margin at mid-run) but never gets below
    what its first run reached: after one more run it has stalled, and the ladder ends converged there."""
    n = 50

    def square(r, idx):
        best = torch.full((len(idx),), 3.0)
        best[idx < 5] = 1.0
        return best, best * 2

    run, seen = _closing_fake(square)
    lad = climb(_ladder(n), LadderSpec(), EPS, run, unstable=False, no_grad=torch.zeros(n, dtype=torch.bool))
    # the first run had nothing before it: its own gain counts, so every sample gets one more run, and only one
    assert [rid for rid, _ in seen if "@" in rid] == ["square@2"] and dict(seen)["square@2"] == list(range(n))
    assert lad.status == CONVERGED and not bool(lad.closing["free"].any())


def test_the_deep_apgd_t_runs_follow_the_class_order_the_sweep_measured():
    """deit 5/255 (design 5): the 12-iteration sweep brought sample 788 to a margin of 0.10 on a class its linearised
    ranking put 4th; the deep run attacked ranks 1-3 and stalled at 1.55, and AutoAttack broke it on that class.
    The deep runs now attack the classes in the order of what the sweep reached on each."""
    n, k = 12, 9
    classes = torch.arange(1, k + 1).repeat(n, 1)  # the sweep attacked classes 1..9 in this order
    reach = torch.full((n, k), -2.0)
    reach[:, 5] = -0.01  # ... and came nearest on class 6, ranked 6th
    reach[:, 7] = -0.5  # then class 8
    seen = {}

    def run(rung: Rung, idx: torch.Tensor):
        seen[rung.id] = rung.order
        still = torch.ones(len(idx), dtype=torch.bool)
        if rung.id == "apgd-t":
            still[:2] = False  # round 1 breaks 2 > tolerance 1: round 2 runs
            return RungResult(still, torch.ones(len(idx)), torch.ones(len(idx)), target_order=classes[idx],
                              target_reach=reach[idx])
        return RungResult(still, torch.ones(len(idx)), torch.ones(len(idx)))

    spec = LadderSpec.from_options({"near_min": 1})
    lad = climb(_ladder(n), spec, EPS, run, unstable=False, no_grad=torch.zeros(n, dtype=torch.bool))
    assert seen["apgd-t"] is None  # round 1 ranks the classes itself
    order = seen["apgd-t@2"]
    assert order is not None and order.shape[1] == k
    assert order[:, :2].tolist() == [[6, 8]] * len(order)  # nearest as measured first, the rest in the sweep's order
    assert order[0, 2:].tolist() == [1, 2, 3, 4, 5, 7, 9]
    assert "ranked by round 1's sweep" in [h for h in lad.history if h["id"] == "apgd-t@2"][0]["settings"]


def test_the_apgd_t_rung_attacks_the_classes_in_a_given_order_and_reports_what_it_reached(deit_model):
    from robustbench_pid.attacks import make_attack

    ds = rbp.load_dataset("digits", split="test")
    x = torch.stack([ds[i][0] for i in range(6)])
    y = torch.tensor([ds[i][1] for i in range(6)])
    atk = make_attack("apgd_ranked", eps=2 / 255, steps=5, targets=2, first=1, pool=9)
    order = torch.stack([torch.tensor([c for c in range(10) if c != int(t)]) for t in y]).flip(1)
    atk.order = order
    atk(deit_model, x, y, generator=torch.Generator().manual_seed(0))
    assert torch.equal(atk.stats["target_order"], order)
    reach = atk.stats["target_reach"]
    assert bool(torch.isfinite(reach[:, 0]).all()) and bool(torch.isinf(reach[:, 2:]).all())  # 2 targets attacked
    assert atk.params() == make_attack("apgd_ranked", eps=2 / 255, steps=5, targets=2, first=1, pool=9).params()
    atk.order = order[:3]
    with pytest.raises(ValueError, match="order must be"):
        atk(deit_model, x, y, generator=torch.Generator().manual_seed(0))


def test_later_rounds_rank_samples_by_the_verdict_margin_any_family_left_as_a_share_of_the_clean_margin():
    """cnn_at 48/255 (design 5): APGD-CE brought sample 1415 to a margin of 0.005 (clean 3.4), but the near set was
    ranked by APGD-T's DLR loss alone, so the deep APGD-T runs never had it, and AutoAttack broke it."""
    n = 10
    lad = _ladder(n)
    lad.clean_margin = torch.full((n,), 4.0)
    lad.clean_margin[7] = 3.4
    lad.margin["gradient"] = torch.linspace(3.0, 1.0, n)
    lad.margin["gradient"][7] = 0.005
    lad.nearness["gradient"] = torch.linspace(-0.9, -0.1, n)  # APGD-T's own ranking: sample 9 nearest, 7 not
    lad.nearness["gradient"][7] = -0.95
    near = lad.near(0.1, 1, "gradient")
    assert near.nonzero().squeeze(1).tolist() == [7]
    # without verdict margins (an attack that reports none), the DLR nearness as before
    lad.margin["gradient"] = torch.full((n,), float("inf"))
    assert lad.near(0.1, 1, "gradient").nonzero().squeeze(1).tolist() == [9]


def test_a_deep_apgd_t_run_still_closing_in_gets_a_fresh_start_on_its_nearest_class_and_the_classes_not_yet_run_deep():
    """cnn_at 48/255: a deep run brought two samples to margins of 0.005 and 0.009 on their nearest class and the
    next round attacked ranks 4-6 instead; AutoAttack broke both on the nearest. cnn_at 64/255 (design 6): sample
    1482's deep runs went back to its nearest classes and never to class 2, which the 12-iteration sweep ranked 4th
    and a 100-iteration run crosses. The family still closing in continues on the class it came nearest on and the
    classes no deep run has had (design 7); the others go on to the next ranks."""
    n, k = 12, 9
    classes = torch.arange(1, k + 1).repeat(n, 1)
    sweep = torch.full((n, k), -2.0)
    sweep[:, 5], sweep[:, 7] = -0.01, -0.5  # measured order: 6, 8, 1, 2, 3, 4, 5, 7, 9
    seen = {}
    inf = torch.tensor(float("inf"))

    def run(rung: Rung, idx: torch.Tensor):
        seen[rung.id] = (idx.tolist(), rung.order)
        m = len(idx)
        still = torch.ones(m, dtype=torch.bool)
        if rung.id in ("apgd-t", "apgd-t@2"):
            still[-2:] = False  # each breaks 2 > tolerance 1: rounds 2 and 3 run
        if rung.id == "apgd-t":
            return RungResult(still, torch.ones(m), torch.ones(m), margin_best=torch.ones(m), margin_half=torch.ones(m),
                              target_order=classes[idx], target_reach=sweep[idx])
        if rung.id == "apgd-t@2":
            best, half = torch.full((m,), 0.9), torch.full((m,), 0.9)
            best[0], half[0] = 0.05, 0.5  # the first sample: 0.45 gained in the last half, 0.05 left: closing in
            reach = torch.full((m, k), float("-inf"))
            reach[:, :3] = -0.3
            reach[0, 1] = -0.001  # ... on class 8, its order's 2nd
            return RungResult(still, torch.ones(m), torch.ones(m), margin_best=best, margin_half=half,
                              target_order=rung.order, target_reach=reach)
        return RungResult(still, torch.ones(m), torch.ones(m), margin_best=inf.repeat(m), margin_half=inf.repeat(m))

    spec = LadderSpec.from_options({"near_min": 1, "near_share": 1.0})
    climb(_ladder(n), spec, EPS, run, unstable=False, no_grad=torch.zeros(n, dtype=torch.bool))
    ids3, order3 = seen["apgd-t@3"]
    first = seen["apgd-t@2"][0][0]
    row = dict(zip(ids3, order3.tolist()))
    # round 3 attacks ranks 4-6: for the closing sample, its nearest class (8), then 2 and 3, the first classes of the
    # sweep's order (6, 8, 1, 2, 3, ...) that round 2's deep run (6, 8, 1) did not have
    assert row[first][3:6] == [8, 2, 3]
    others = [i for i in ids3 if i != first]
    assert others and all(row[i][3:6] == [2, 3, 4] for i in others)  # the rest: the next measured ranks
    assert sorted(row[first]) == list(range(1, k + 1))  # every class once


def test_a_gradient_search_stalled_at_the_boundarys_edge_gets_more_starts_and_only_the_edge_past_the_cap():
    n = 5
    lad = _ladder(n)
    lad.clean_margin = torch.full((n,), 4.0)
    # 0.1% and 0.75% of the clean margin (on the edge), 9.75% (a near miss), 10.25%, 50%
    lad.margin["gradient"] = torch.tensor([0.004, 0.03, 0.39, 0.41, 2.0])
    spec = LadderSpec()
    assert lad.near_miss(spec).tolist() == [True, True, True, False, False]
    assert lad.edge_starts(spec).tolist() == [7, 7, 0, 0, 0]  # near_tries + edge_tries
    assert lad.closing_in(spec)["targeted"].tolist() == [True, True, True, False, False]
    assert not lad.closing_in(spec)["ce"].any()  # the targeted family goes on; the others by their own progress
    lad.spent["targeted"][1:3] = spec.cap_targeted  # AutoAttack's APGD-T budget spent: a near miss's stall counts ...
    assert lad.closing_in(spec)["targeted"].tolist() == [True, True, False, False, False]  # ... not an edge's
    assert not lad.closing_in(spec, under_cap=False)["targeted"].any()
    lad.spent["targeted"][2] = 0
    lad.near_tries[2] = spec.near_tries  # design 7: its extra start spent, a near miss that stalled again is evidence
    lad.near_tries[1] = spec.near_tries + spec.edge_tries  # design 10: an edge's starts spent, likewise
    assert lad.closing_in(spec)["targeted"].tolist() == [True, False, False, False, False]
    assert lad.near_miss(spec)[1] and lad.near_miss(spec)[2] and lad.edge_starts(spec)[1] == 0
    assert "edge_tries 0 < 6" in LadderSpec.from_options({"edge_tries": 0}).reductions()
    with pytest.raises(UserError, match="edge"):
        LadderSpec.from_options({"edge": -1})
    assert "near_tries 0 < 1" in LadderSpec.from_options({"near_tries": 0}).reductions()
    assert LadderSpec.from_options({"near_miss": 0}).near_miss == 0.0
    assert "near_miss 0.01 < 0.1" in LadderSpec.from_options({"near_miss": 0.01}).reductions()
    with pytest.raises(UserError, match="near_miss"):
        LadderSpec.from_options({"near_miss": -1})


@pytest.mark.parametrize("left", [0.2, 0.01])
def test_a_near_miss_gets_one_fresh_start_on_the_class_it_came_nearest_on_and_then_the_ladder_stops(left):
    """Design 7: a sample a gradient search left at 5% of its clean margin, stalled (no gain): a continuation round
    runs APGD-T on that sample alone, on the one class round 1's sweep came nearest on (the other positions -1,
    skipped), once; stalled again, the ladder ends converged (design 6 went on to the 900-pass cap, three classes a
    round: a large share of cnn_at 64/255's forward passes). Design 10: at 0.25%, on the boundary's edge, it gets
    near_tries + edge_tries (7) starts on that class, three a round."""
    n, k = 12, 9
    classes = torch.arange(1, k + 1).repeat(n, 1)
    sweep = torch.full((n, k), -2.0)
    sweep[:, 6] = -0.01  # the sweep came nearest on class 7
    seen = []

    def run(rung: Rung, idx: torch.Tensor):
        seen.append((rung.id, idx.tolist(), None if rung.order is None else rung.order.tolist()))
        m = len(idx)
        best = torch.where(idx == 0, torch.tensor(left), torch.tensor(2.0))
        res = RungResult(torch.ones(m, dtype=torch.bool), torch.ones(m), torch.ones(m), margin_best=best,
                         margin_half=best.clone())
        if rung.id == "apgd-t":
            res.target_order, res.target_reach = classes[idx], sweep[idx]
        return res

    lad = _ladder(n)
    lad.clean_margin = torch.full((n,), 4.0)
    lad = climb(lad, LadderSpec(), EPS, run, unstable=False, no_grad=torch.zeros(n, dtype=torch.bool))
    later = [s for s in seen if "@" in s[0]]
    if left == 0.2:
        assert [(rid, ids) for rid, ids, _ in later] == [("apgd-t@2", [0])]
        assert later[0][2][0][:3] == [7, -1, -1]
        assert int(lad.near_tries[0]) == 1 and lad.status == CONVERGED and "further round(s)" in lad.detail
        return
    assert [(rid, ids) for rid, ids, _ in later] == [("apgd-t@2", [0]), ("apgd-t@3", [0]), ("apgd-t@4", [0])]
    lo = [3 * (int(rid.split("@")[1]) - 2) for rid, _, _ in later]  # each round's first ranked position
    assert [order[0][a:a + 3] for (_, _, order), a in zip(later, lo)] == [[7, 7, 7], [7, 7, 7], [7, -1, -1]]
    assert int(lad.near_tries[0]) == 7 and lad.status == CONVERGED
    assert lad.spent["targeted"][0] > 0 and not lad.edge_left(LadderSpec()).any()


def test_apgd_ranked_skips_the_positions_an_order_marks_minus_one(deit_model):
    import robustbench_pid as rbp
    from robustbench_pid.attacks import make_attack

    ds = rbp.load_dataset("digits", split="test")
    x = torch.stack([ds[i][0] for i in range(4)])
    y = torch.tensor([ds[i][1] for i in range(4)])
    order = torch.stack([torch.tensor([c for c in range(10) if c != int(t)]) for t in y])
    order[:2, 1:3] = -1  # the first two samples: only their first class
    atk = make_attack("apgd_ranked", eps=2 / 255, steps=5, targets=3, first=1, pool=9)
    atk.order = order
    atk(deit_model, x, y, generator=torch.Generator().manual_seed(0))
    reach = atk.stats["target_reach"]
    assert bool(torch.isfinite(reach[:, 0]).all()) and bool(torch.isinf(reach[:2, 1:3]).all())
    assert bool(torch.isfinite(reach[2:, 1:3]).all())
    assert atk.telemetry.backward[:2].max() < atk.telemetry.backward[2:].min()  # fewer passes where skipped
