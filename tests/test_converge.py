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
from robustbench_pid.results.summaries.converge import (BATCH_DEPENDENT, CONVERGED, NOT_CONVERGED, RANDOM_OUTPUTS,
                                                        REDUCED, RUNG_ORDER, UPPER_BOUND)

EPS = 0.1
# a cut-down ladder for tests that do not read its status (its status says "reduced ladder")
FAST = {"steps": 25, "sweep_steps": 6, "square_queries": 100, "square_budget": 200, "eot_iter": 4, "spsa_iterations": 5,
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
    # round 1 runs the targeted margin, CE gradient and gradient-free families; the boundary family (FAB-T) runs
    # only its full budget, beside APGD-T's, in a later round
    assert rungs[:4] == ["user", "apgd-t", "apgd-ce", "square"] and "fab-t" not in rungs
    assert {r.split("@")[0] for r in rungs[4:]} <= {"apgd-t", "fab-t", "square"}
    assert [r for r in rungs if r.startswith("fab-t@")] == [r.replace("apgd-t", "fab-t") for r in rungs
                                                            if r.startswith("apgd-t@")]
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
    tol = int(rec["converge_tolerance"].iloc[0])
    assert last_round <= tol and int(rec["converge_last_broke"].sum()) == last_round
    # APGD-CE runs once (round 1 is its full budget); a later round runs the other families' full budgets
    assert rounds[:4] == [0, 1, 1, 1] and not [r for r in rungs if r.startswith("apgd-ce@")]
    # the records carry the stop rule's evidence: judged again from them, the unit's verdict and the condition's
    from robustbench_pid.results.summaries.converge import condition_verdict, evidence
    from robustbench_pid.results.summaries.stop_rule import near, verdict

    ev = evidence(rec)
    assert verdict(ev, tol) == (rec["converge_status"].iloc[0], rec["converge_detail"].iloc[0])
    assert condition_verdict(rec) == (row["status"], row["status_detail"])
    tau = float(rec["converge_tau"].iloc[0])
    assert tau in (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)
    # the still-robust samples that had a kind's full budget are exactly those near for it at the last tau
    g, f = near(ev["left_gradient"].to_numpy(), ev["left_free"].to_numpy(), tau)
    robust = rec["correct_top1"].astype(bool).to_numpy()
    assert (rec["converge_full_gradient"].astype(bool).to_numpy()[robust] == g[robust]).all()
    assert (rec["converge_full_free"].astype(bool).to_numpy()[robust] == f[robust]).all()
    for col in ("margin_gradient", "margin_free"):  # every family reported how near it came on what it attacked
        assert np.isfinite(rec[col].to_numpy()[robust]).all(), col
    assert (rec["margin_clean"].to_numpy()[robust] > 0).all()
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
    """``n`` still-robust samples whose clean verdict margins are 1, so that a margin a rung reaches is the share
    of the clean margin it left (what ``tau`` is compared with)."""
    return Ladder(robust=torch.ones(n, dtype=torch.bool), clean_margin=torch.ones(n))


def _fake(breaks: dict, gradient=None, free=None):
    """A rung runner. ``breaks[rung id]``: how many of the first samples it is given it breaks, or the set of sample
    ids it breaks (where given them); ``gradient`` / ``free``: per sample, the lowest verdict margin (``margin_best``)
    the gradient families (and EOT, SPSA) / Square report. Its L-inf Square reports the state to continue from as the
    real one does: the sign pattern of its best point (+1 on even samples, -1 on odd ones) and the queries done.
    ``seen``: (rung id, samples) per call; ``run.rungs``: rung id -> the rung it was given."""
    seen = []
    rungs = {}

    def run(rung: Rung, idx: torch.Tensor):
        seen.append((rung.id, idx.tolist()))
        rungs[rung.id] = rung
        b = breaks.get(rung.id, 0)
        if isinstance(b, int):
            still = torch.ones(len(idx), dtype=torch.bool)
            still[:b] = False
        else:
            still = torch.tensor([i not in b for i in idx.tolist()], dtype=torch.bool)
        m = free if rung.kind == "free" else gradient
        res = RungResult(still, torch.ones(len(idx)), torch.ones(len(idx)),
                         margin_best=None if m is None else m[idx].clone())
        if rung.attack == "square":
            res.done = (rung.resume[1] if rung.resume is not None else torch.zeros(len(idx))) + rung.params["n_queries"]
            res.signs = (1 - 2 * (idx % 2)).to(torch.int8).reshape(-1, 1, 1, 1)
        return res

    run.rungs = rungs
    return run, seen


ROUND1 = ["apgd-t", "apgd-ce", "square"]  # FAB-T has no round-1 run: its full budget only
NONE = torch.zeros(1000, dtype=torch.bool)


def _climb(n: int, run, spec=None, lad=None, **kw) -> Ladder:
    kw.setdefault("unstable", False)
    kw.setdefault("no_grad", torch.zeros(n, dtype=torch.bool))
    return climb(lad if lad is not None else _ladder(n), spec or LadderSpec(), EPS, run, **kw)


def _later(seen):
    return [(rid, ids) for rid, ids in seen if "@" in rid]


def test_round_one_runs_apgd_t_apgd_ce_and_square_on_every_still_robust_sample_at_their_first_budgets():
    """Round 1: APGD-T's sweep of 9 ranked targets x 12 iterations, APGD-CE 100 and Square 500, each on every sample
    still robust after the rungs before it (FAB-T has no round-1 run: round 1 is the three fast finders of near
    samples). Breaking 1 <= max(1, 0.1% of 1000) with no sample near (no margins reported) ends the ladder there."""
    run, seen = _fake({"apgd-t": [3]})
    lad = _climb(1000, run)
    assert [s[0] for s in seen] == ROUND1
    assert seen[0][1] == list(range(1000)) and all(ids == [i for i in range(1000) if i != 3] for _, ids in seen[1:])
    assert [h["settings"] for h in lad.history] == ["APGD-T-12 (targets 1-9 of 9 ranked by boundary distance)",
                                                    "APGD-CE-100", "Square-500 (p_init 0.8, 1 restart)"]
    assert [h["round"] for h in lad.history] == [1, 1, 1] and lad.broken_by[3] == "apgd-t"
    assert lad.status == CONVERGED and lad.tau == 1 / 16
    assert lad.detail == ("every sample within tau = 0.0625 of its clean margin had each family's full AutoAttack "
                          "budget, and the last round broke 1 sample(s) (tolerance 1)")
    assert lad.last_broke.nonzero().squeeze(1).tolist() == [3]
    assert not lad.full["gradient"].any() and not lad.full["free"].any()
    # only still-robust samples reach a later rung: APGD-CE the 990 APGD-T left, Square the 985 after it
    run, seen = _fake({"apgd-t": 10, "apgd-ce": 5})
    lad = _climb(1000, run)
    assert [s[0] for s in seen][:3] == ROUND1
    assert [len(s[1]) for s in seen[:3]] == [1000, 990, 985]
    assert set(seen[1][1]).isdisjoint(range(10)) and set(seen[2][1]).isdisjoint(seen[1][1][:5])
    # round 1 broke 15 > 1 and no sample is near: tau doubles past every tau that adds none (1/8 ... 1/2) to 1,
    # where every still-robust sample gets the full budgets (FAB-T's first run); APGD-CE's round 1 was its full
    # budget: it has no turn
    assert _later(seen) == [("apgd-t@2", seen[2][1]), ("fab-t@2", seen[2][1]), ("square@2", seen[2][1])]
    assert lad.tau == 1.0 and lad.status == CONVERGED and bool(lad.full["gradient"].eq(lad.robust).all())
    assert lad.detail.startswith("every still-robust sample had each family's full AutoAttack budget, and the last "
                                 "round broke 0 sample(s)")


def test_the_gradient_free_rung_breaking_more_than_the_tolerance_keeps_the_ladder_climbing():
    """The adversarially trained model the issue met: the gradient rungs break 1, Square 2 in round 1 (3 > the
    tolerance, 0): the next round runs the full budgets, here on every sample (none was near before tau 1)."""
    run, seen = _fake({"apgd-t": 1, "square": 2})
    lad = _climb(200, run)
    assert [s[0] for s in seen] == ROUND1 + ["apgd-t@2", "fab-t@2", "square@2"]
    assert [len(ids) for _, ids in _later(seen)] == [197, 197, 197]
    assert lad.status == CONVERGED and int((~lad.robust).sum()) == 3 and lad.tau == 1.0


def test_no_gradient_samples_get_spsa_after_the_families_and_a_randomised_model_the_eot_rungs_first():
    no_grad = torch.zeros(50, dtype=torch.bool)
    no_grad[10:20] = True
    run, seen = _fake({})
    lad = _climb(50, run, unstable=True, no_grad=no_grad)
    ids = [s[0] for s in seen]
    assert ids == ["eot-ce", "eot-dlr"] + ROUND1 + ["spsa"]
    assert dict(seen)["eot-ce"] == list(range(50)) and dict(seen)["spsa"] == list(range(10, 20))
    assert [h["settings"] for h in lad.history][:2] == ["APGD-CE-100 (EOT over 20 draws)",
                                                        "APGD-DLR-100 (EOT over 20 draws)"]
    assert lad.status == UPPER_BOUND and "on 10 still-robust sample(s) (tolerance 0)" in lad.detail
    # one sample without gradients is within a tolerance of 1; the random forward pass then makes it not converged
    run, seen = _fake({})
    lad = _climb(50, run, LadderSpec(tol_min=1), unstable=True, no_grad=torch.arange(50) == 7)
    assert dict(seen)["spsa"] == [7] and lad.status == RANDOM_OUTPUTS
    # random gradients at a deterministic forward pass: the EOT rungs run, the rounds judge as usual
    run, seen = _fake({})
    lad = _climb(50, run, random_gradients=True)
    assert [s[0] for s in seen] == ["eot-ce", "eot-dlr"] + ROUND1 and lad.status == CONVERGED
    # under L2 Square covers the samples without gradients: no SPSA
    run, seen = _fake({})
    _climb(50, run, no_grad=no_grad, norm="l2")
    assert [s[0] for s in seen] == ROUND1 and seen[-1][0] == "square"


def test_near_samples_get_their_kinds_full_budget_once_and_apgd_ce_does_not_run_again():
    """Near at tau: for the gradient families where one of them left at most tau of the clean margin (here 1), for
    Square where Square did or came nearer than they did. Round 2 (tau 1/16) gives the gradient-near samples APGD-T's
    and FAB-T's full budgets, the Square-near ones Square's; round 2 breaking 2 > 0 doubles tau, and round 3 (1/8)
    takes only the samples that became near and never had the budget. Square came nearer on one sample (20): more
    than the tolerance of 100 samples (0), so Square is the gradient families' rival and every still-robust sample is
    near for Square (design 14); with a tolerance of 1 it is not, and Square takes only its own."""
    n = 100
    g = torch.full((n,), 0.9)
    g[0:5] = 0.05
    g[5:10] = 0.1  # near at 1/8, not at 1/16
    g[40] = 0.03
    g[60] = 1 / 16  # at most tau: near
    f = torch.full((n,), 2.0)
    f[20] = 0.5  # far, but nearer than the gradient families came (0.9): Square's evidence only
    f[40] = 0.04  # within tau (though the gradients came nearer)
    f[30] = 0.9  # as near as the gradients, not nearer: not near
    grad_near, free_near = [0, 1, 2, 3, 4, 40, 60], [20, 40]
    run, seen = _fake({}, g, f)
    lad = _climb(n, run, LadderSpec(tol_min=1))
    assert _later(seen) == [("apgd-t@2", grad_near), ("fab-t@2", grad_near), ("square@2", free_near)]
    assert not lad.rivals and lad.status.startswith("converged (reduced ladder (tol_min 1 > 0)")
    free_near = list(range(n))  # the default tolerance: Square is a rival, so every sample is near for it
    run, seen = _fake({}, g, f)
    lad = _climb(n, run)
    assert _later(seen) == [("apgd-t@2", grad_near), ("fab-t@2", grad_near), ("square@2", free_near)] and lad.rivals
    assert lad.full["gradient"].nonzero().squeeze(1).tolist() == grad_near
    assert lad.full["free"].nonzero().squeeze(1).tolist() == free_near
    assert lad.status == CONVERGED and lad.tau == 1 / 16
    assert [h["scope"] for h in lad.history if h["round"] == 2] == ["near"] * 3
    run, seen = _fake({"apgd-t@2": 2}, g, f)  # breaks 0 and 1
    lad = _climb(n, run)
    assert _later(seen) == [("apgd-t@2", grad_near), ("fab-t@2", grad_near[2:]), ("square@2", free_near[2:]),
                            ("apgd-t@3", [5, 6, 7, 8, 9]), ("fab-t@3", [5, 6, 7, 8, 9])]  # Square had them all
    assert lad.status == CONVERGED and lad.tau == 1 / 8 and lad.last_broke.sum() == 0
    assert lad.detail == ("every sample within tau = 0.125 of its clean margin had each family's full AutoAttack "
                          "budget, and the last round broke 0 sample(s) (tolerance 0)")
    # each sample had each kind's full budget at most once
    for fam in ("apgd-t", "fab-t", "square"):
        runs = [set(ids) for rid, ids in _later(seen) if rid.split("@")[0] == fam]
        assert sum(len(s) for s in runs) == len(set().union(*runs)), fam


def test_tau_doubles_while_the_last_round_breaks_more_than_the_tolerance_skipping_a_tau_that_adds_no_sample():
    """Rounds at tau 1/16, 1/8, (1/4 adds no sample: skipped), 1/2 and 1 = every still-robust sample; each breaks 2
    (> the tolerance, 0): not converged at tau 1, where every sample had the full budget. ``on_round`` hears each
    round's samples per kind as it is decided."""
    n = 100
    g = torch.full((n,), 0.9)
    g[0:10], g[10:20], g[20:30] = 0.05, 0.1, 0.4
    f = torch.full((n,), 5.0)  # Square came nowhere near, nor nearer than the gradients
    breaks = {f"apgd-t@{r}": 2 for r in range(2, 9)}
    heard = []

    def on_round(r, scopes, rungs):
        assert all(rung.round == r for rung in rungs)
        heard.append((r, int(scopes["gradient"].sum()), int(scopes["free"].sum())))

    run, seen = _fake(breaks, g, f)
    lad = _climb(n, run, on_round=on_round)
    later = _later(seen)
    assert [rid for rid, _ in later] == ["apgd-t@2", "fab-t@2", "apgd-t@3", "fab-t@3", "apgd-t@4", "fab-t@4",
                                         "apgd-t@5", "fab-t@5", "square@5"]
    assert dict(later)["apgd-t@2"] == list(range(10)) and dict(later)["apgd-t@3"] == list(range(10, 20))
    assert dict(later)["apgd-t@4"] == list(range(20, 30)) and dict(later)["apgd-t@5"] == list(range(30, 100))
    broken = {0, 1, 10, 11, 20, 21, 30, 31}
    assert dict(later)["square@5"] == [i for i in range(n) if i not in broken]  # Square's full budget: every sample
    assert heard == [(1, 100, 100), (2, 10, 0), (3, 10, 0), (4, 10, 0), (5, 70, 94)]
    assert lad.tau == 1.0 and lad.status == NOT_CONVERGED and int(lad.last_broke.sum()) == 2
    assert lad.detail == ("every still-robust sample had the full budget and the last round still broke 2 sample(s) "
                          "(tolerance 0): the number is an upper bound")
    assert bool(lad.full["gradient"][lad.robust].all()) and bool(lad.full["free"][lad.robust].all())
    # the round at 1/2 breaking 0 <= 0 ends the ladder there, converged
    run, seen = _fake({**breaks, "apgd-t@4": 0}, g, f)
    lad = _climb(n, run)
    assert [rid for rid, _ in _later(seen)][-1] == "fab-t@4" and lad.tau == 0.5 and lad.status == CONVERGED
    assert "every sample within tau = 0.5 of its clean margin" in lad.detail


def test_the_full_apgd_t_runs_follow_the_class_order_the_sweep_measured():
    """deit 5/255 (design 5): the 12-iteration sweep brought sample 788 to a margin of 0.10 on a class its linearised
    ranking put 4th; AutoAttack broke it on that class. The full runs attack each sample's classes in the order of
    what the sweep reached on each."""
    n, k = 12, 9
    classes = torch.arange(1, k + 1).repeat(n, 1)  # the sweep attacked classes 1..9 in this order
    reach = torch.full((n, k), -2.0)
    reach[:, 5] = -0.01  # ... and came nearest on class 6, ranked 6th
    reach[:, 7] = -0.5  # then class 8
    reach[4, 0] = -0.001  # sample 4: nearest on class 1
    seen = {}

    def run(rung: Rung, idx: torch.Tensor):
        seen[rung.id] = (idx.tolist(), rung.order)
        still = torch.ones(len(idx), dtype=torch.bool)
        res = RungResult(still, torch.ones(len(idx)), torch.ones(len(idx)), margin_best=torch.full((len(idx),), 0.01))
        if rung.id == "apgd-t":
            still[:2] = False  # samples 0 and 1 break in round 1
            res.target_order, res.target_reach = classes[idx], reach[idx]
        return res

    lad = _climb(n, run)
    assert seen["apgd-t"][1] is None  # round 1 ranks the classes itself
    ids, order = seen["apgd-t@2"]
    assert ids == list(range(2, n)) and order is not None and order.shape == (n - 2, k)
    rows = dict(zip(ids, order.tolist()))
    assert rows[4] == [1, 6, 8, 2, 3, 4, 5, 7, 9]  # nearest as measured first, the rest in the sweep's order
    assert all(rows[i] == [6, 8, 1, 2, 3, 4, 5, 7, 9] for i in ids if i != 4)
    assert seen["fab-t@2"][1] is None
    settings = {h["id"]: h["settings"] for h in lad.history}
    assert settings["apgd-t@2"] == "APGD-T-100 (targets 1-9 of 9 ranked by round 1's sweep)"
    assert settings["fab-t@2"] == "FAB-T-100 (9 targets)"
    # a sweep that reported no measured order: the full run ranks the classes itself
    run, seen2 = _fake({}, torch.full((n,), 0.01))
    lad = _climb(n, run)
    assert run.rungs["apgd-t@2"].order is None
    assert [h["settings"] for h in lad.history if h["id"] == "apgd-t@2"] == [
        "APGD-T-100 (targets 1-9 of 9 ranked by boundary distance)"]


def test_square_continues_each_samples_search_from_its_best_point_to_autoattacks_5000_queries():
    """Square's full budget continues round 1's 500-query run of each sample from its best point (its sign pattern,
    the square-size schedule moved on by the queries done): 4,500 more, AutoAttack's one 5,000-query run in two
    pieces. Its L2 form keeps no such state: 5,000 queries afresh. (A tolerance of 3 keeps Square from being the
    gradient families' rival on these 3 samples, so only they are near for it.)"""
    n = 10
    g = torch.full((n,), 0.9)
    f = torch.full((n,), 2.0)
    f[[3, 4, 7]] = 0.02
    tol3 = LadderSpec.from_options({"tol_min": 3})
    run, seen = _fake({}, g, f)
    lad = _climb(n, run, tol3)
    assert _later(seen) == [("square@2", [3, 4, 7])]
    rung = run.rungs["square@2"]
    assert rung.params["n_queries"] == 4500 and rung.resume is not None
    signs, done = rung.resume
    assert signs.flatten().tolist() == [-1, 1, -1] and done.tolist() == [500.0, 500.0, 500.0]
    assert [h["settings"] for h in lad.history if h["family"] == "free"] == [
        "Square-500 (p_init 0.8, 1 restart)",
        "Square +4500 (p_init 0.8, 1 restart), continuing each sample's run from its best point"]
    assert lad.kept["free"]["done"].tolist() == [500.0 if i not in (3, 4, 7) else 5000.0 for i in range(n)]
    # another budget: the continuation is what is left of it
    run, _ = _fake({}, g, f)
    _climb(n, run, LadderSpec.from_options({"square_budget": 2000, "tol_min": 3}))
    assert run.rungs["square@2"].params["n_queries"] == 1500
    # L2: the families' L2 forms, Square's full budget afresh
    run, seen = _fake({}, g, f)
    lad = _climb(n, run, tol3, norm="l2")
    assert _later(seen) == [("square@2", [3, 4, 7])]
    assert run.rungs["square@2"].resume is None and run.rungs["square@2"].params["n_queries"] == 5000
    assert [h["settings"] for h in lad.history if h["family"] == "free"] == [
        "Square-L2-500 (p_init 0.8, 1 restart)", "Square-L2-5000 (p_init 0.8, 1 restart)"]


def test_a_square_full_run_without_round_ones_state_is_the_full_budget_afresh():
    """The documented fall-back (``Free.prepare``: "no search to continue: the full budget afresh"). A sample whose
    round-1 Square state is missing (here: reported as 0 queries done, as the real Square reports a still-robust
    sample it did not attack, e.g. one the attacked model misclassified at the clean point) must not cost the other
    samples their continuation, and whatever runs afresh must run AutoAttack's 5,000 queries."""
    n = 10
    g = torch.full((n,), 0.9)
    f = torch.full((n,), 0.02)
    base, _ = _fake({}, g, f)

    def run(rung, idx):
        res = base(rung, idx)
        if rung.id == "square":
            res.done[idx == 5] = 0  # sample 5: no search to continue
        return res

    _climb(n, run)
    rung = base.rungs["square@2"]
    assert rung.resume is not None or rung.params["n_queries"] == 5000


def test_round_two_runs_each_familys_full_autoattack_budget_and_round_one_its_first_budget():
    from robustbench_pid.benchmarks.ladder import planned_round

    spec = LadderSpec()
    got = {r: [(x.id, x.attack, x.params, x.family, x.scope) for x in planned_round(spec, EPS, r, False, False)]
           for r in (1, 2, 5)}
    assert got[1] == [("apgd-t", "apgd_ranked", {"eps": EPS, "steps": 12, "targets": 9, "first": 1, "pool": 9},
                       "targeted", "robust"),
                      ("apgd-ce", "apgd_ce", {"eps": EPS, "steps": 100}, "ce", "robust"),
                      ("square", "square", {"eps": EPS, "n_queries": 500}, "free", "robust")]
    for r in (2, 5):
        assert got[r] == [(f"apgd-t@{r}", "apgd_ranked", {"eps": EPS, "steps": 100, "targets": 9, "first": 1,
                                                          "pool": 9}, "targeted", "near"),
                          (f"fab-t@{r}", "fab_t", {"eps": EPS, "steps": 100, "targets": 9, "first": 1}, "boundary",
                           "near"),
                          (f"square@{r}", "square", {"eps": EPS, "n_queries": 4500}, "free", "near")]
    l2 = [(x.id, x.attack, x.params.get("n_queries")) for x in planned_round(spec, EPS, 2, False, False, "l2")]
    assert l2 == [("apgd-t@2", "apgd_ranked_l2", None), ("fab-t@2", "fab_t_l2", None), ("square@2", "square_l2", 5000)]
    # a randomised model's EOT rungs and the no-gradient SPSA are round 1's, before and after the families; L2: no SPSA
    assert [x.id for x in planned_round(spec, EPS, 1, True, True)] == ["eot-ce", "eot-dlr"] + ROUND1 + ["spsa"]
    assert [x.id for x in planned_round(spec, EPS, 1, True, True, "l2")] == ["eot-ce", "eot-dlr"] + ROUND1
    assert [x.id for x in planned_round(spec, EPS, 2, True, True)] == ["apgd-t@2", "fab-t@2", "square@2"]
    small = LadderSpec.from_options({"steps": 50, "pool": 4})
    assert [(x.params.get("steps"), x.params.get("targets")) for x in planned_round(small, EPS, 2, False, False)] == [
        (50, 4), (50, 4), (None, None)]


def test_a_kinds_margin_is_the_lowest_any_of_its_rungs_reached_as_a_share_of_the_clean_margin():
    """cnn_at 48/255 (design 5): APGD-CE brought sample 1415 to a margin of 0.005 (clean 3.4), and the near set was
    chosen by APGD-T's evidence alone, so the full APGD-T runs never had it; AutoAttack broke it. Every gradient
    family's margin (and EOT's, SPSA's) is the gradient kind's evidence; Square's is its own."""
    from robustbench_pid.results.summaries.stop_rule import near

    n = 10
    lad = _ladder(n)
    lad.clean_margin = torch.full((n,), 4.0)
    lad.clean_margin[7] = 3.4
    idx = torch.arange(n)
    P = {"eps": EPS}

    def res(margin):
        return RungResult(torch.ones(n, dtype=torch.bool), torch.ones(n), torch.ones(n), margin_best=margin)

    t_margin = torch.linspace(3.0, 1.0, n)
    lad.record(Rung("apgd-t", "apgd_ranked", P, "targeted"), idx, res(t_margin))
    ce = torch.full((n,), 3.9)
    ce[7] = 0.005
    lad.record(Rung("apgd-ce", "apgd_ce", P, "ce"), idx, res(ce))
    spsa = torch.full((n,), 3.9)
    spsa[2] = 0.2
    lad.record(Rung("spsa", "spsa", P, scope="no-gradient"), idx, res(spsa))
    sq = torch.full((n,), 0.8)
    sq[9] = 0.1
    lad.record(Rung("square", "square", P, "free"), idx, res(sq))
    want = torch.minimum(torch.minimum(t_margin, ce), spsa)
    assert torch.equal(lad.margin["gradient"], want) and torch.equal(lad.margin["free"], sq)
    assert lad.left("gradient")[7].item() == pytest.approx(0.005 / 3.4)
    assert lad.left("gradient")[2].item() == pytest.approx(0.05)
    g, f = near(lad.left("gradient").numpy(), lad.left("free").numpy(), 1 / 16)
    assert g.nonzero()[0].tolist() == [2, 7]
    # Square: within tau on sample 9 (0.025), and nearer than the gradient families wherever they left more than it
    assert f.nonzero()[0].tolist() == [0, 1, 3, 4, 5, 6, 8, 9]
    # a later rung's margin only ever lowers a kind's evidence; a rung that reports none leaves it
    lad.record(Rung("apgd-t@2", "apgd_ranked", P, "targeted", 2, "near"), idx[:3],
               RungResult(torch.ones(3, dtype=torch.bool), torch.ones(3), torch.ones(3),
                          margin_best=torch.tensor([9.0, 0.5, 0.1])))
    lad.record(Rung("fab-t@2", "fab_t", P, "boundary", 2, "near"), idx, res(None))
    assert lad.margin["gradient"][:3].tolist() == pytest.approx([want[0].item(), 0.5, 0.1])
    # without a clean margin no share is known: nothing is near before tau 1
    lad.clean_margin = None
    assert bool(torch.isinf(lad.left("gradient")).all())


def test_a_random_search_nearer_than_the_gradients_gets_its_full_budget_and_only_the_probe_makes_gradients_mislead():
    """Design 11: samples on which Square came nearer than every gradient family (here 0.3 against 0.5, both beyond
    tau) get Square's full budget (since design 14, when they are more than the tolerance, every sample does), and
    are no reason for "gradients mislead"; only the gradient probe's flag
    (``ladder.misleading``) on more than the tolerance of the still-robust samples makes the number that upper bound,
    whatever the rounds broke. The probe's flag on a sample a rung broke does not count."""
    from robustbench_pid.results.summaries.converge import MISLED

    n = 100
    g = torch.full((n,), 0.5)
    for nearer, flagged, broken, want in ((5, 0, (), CONVERGED), (0, 2, (), MISLED), (5, 1, (), MISLED),
                                          (0, 0, (), CONVERGED), (0, 1, (50,), CONVERGED), (5, 3, (), MISLED)):
        f = torch.full((n,), 6.0)
        f[:nearer] = 0.3
        lad = _ladder(n)
        lad.misleading[50:50 + flagged] = True
        run, seen = _fake({"apgd-t": set(broken)}, g, f)
        _climb(n, run, lad=lad)
        assert lad.status == want, (nearer, flagged, broken, lad.status)
        if broken:  # round 1 broke more than the tolerance (0): tau widened to 1/2, where every sample is near
            assert bool(lad.full["gradient"][lad.robust].all())
            continue
        # more nearer samples than the tolerance make Square the gradient families' rival: every sample is near
        # for it (design 14)
        assert _later(seen) == ([("square@2", list(range(n)))] if nearer else [])
        assert lad.full["free"].nonzero().squeeze(1).tolist() == (list(range(n)) if nearer else [])
        assert not lad.full["gradient"].any()
        if want == MISLED:
            assert lad.detail.startswith(f"the gradient probe flags {flagged} still-robust sample(s) (tolerance 0)")
    # beyond the tolerance, samples without usable gradients come first: an upper bound of that kind
    lad = _ladder(n)
    lad.misleading[50:53] = True
    run, _ = _fake({}, g, torch.full((n,), 6.0))
    _climb(n, run, lad=lad, no_grad=torch.arange(n) < 2)
    assert lad.status == UPPER_BOUND


def test_a_reduced_ladder_says_so_in_its_status_and_rung_settings():
    spec = LadderSpec.from_options({"steps": 1, "sweep_steps": 2})
    assert spec.reductions() == ["steps 1 < 100", "sweep_steps 2 < 12"]
    run, _ = _fake({})
    lad = _climb(100, run, spec)
    assert lad.status == f"{REDUCED} (steps 1 < 100, sweep_steps 2 < 12)" and lad.status != CONVERGED
    assert [h["settings"] for h in lad.history][:2] == ["APGD-T-2 (targets 1-9 of 9 ranked by boundary distance)",
                                                        "APGD-CE-1"]
    # a smaller tau to start from gives fewer samples the full budget: weaker; a larger one, stronger
    assert LadderSpec.from_options({"near": 1 / 32}).reductions() == ["near 0.03125 < 0.0625"]
    assert LadderSpec.from_options({"near": 0.125}).reductions() == []
    assert LadderSpec.from_options({"tol_share": 0.01}).reductions() == ["tol_share 0.01 > 0.001"]
    assert LadderSpec.from_options({"tol_min": 2, "pool": 5, "square_budget": 3000}).reductions() == [
        "tol_min 2 > 0", "pool 5 < 9", "square_budget 3000 < 5000"]
    assert LadderSpec.from_options({"square_queries": 1000, "square_budget": 10000, "near": 1}).reductions() == []
    # a verdict that is not "converged" is not made a reduced one
    run, _ = _fake({"apgd-t": 5})
    lad = _climb(100, run, spec, no_grad=torch.arange(100) < 50)
    assert lad.status == UPPER_BOUND


def test_the_ladder_settings_are_checked_where_they_enter():
    """Twelve settings; a key of an earlier design is unknown; ``near`` is a share in (0, 1], ``edge`` one in [0, 1);
    Square's full budget continues round 1's run, so it is at least round 1's queries."""
    from dataclasses import fields

    assert [f.name for f in fields(LadderSpec)] == ["tol_share", "tol_min", "near", "edge", "steps", "pool",
                                                    "sweep_steps", "square_queries", "square_budget", "eot_iter",
                                                    "spsa_iterations", "spsa_samples"]
    for key in ("fab_steps", "rounds", "targets", "near_share", "near_min", "cap_free", "lookahead", "square_growth",
                "continue_rounds", "edge_tries", "near_miss", "unstable_rtol", "eot_steps"):
        with pytest.raises(UserError, match=f"unknown --converge-opt key\\(s\\) '{key}'; valid: tol_share, tol_min"):
            LadderSpec.from_options({key: 1})
    with pytest.raises(UserError, match="key\\(s\\) 'bogus', 'rounds'"):
        LadderSpec.from_options({"rounds": 3, "bogus": 1, "steps": 5})
    for bad in (0, -0.1, 1.5, float("nan"), float("inf")):
        with pytest.raises(UserError, match=r"near must be a share of the clean margin in \(0, 1\]"):
            LadderSpec.from_options({"near": bad})
    assert LadderSpec.from_options({"near": 1}).near == 1.0 and LadderSpec.from_options({"near": "0.25"}).near == 0.25
    for bad in (-0.01, 1, float("nan")):
        with pytest.raises(UserError, match=r"edge must be a share of the clean margin in \[0, 1\), got .*\(0: no fresh"):
            LadderSpec.from_options({"edge": bad})
    assert LadderSpec.from_options({"edge": 0}).edge == 0.0 and LadderSpec.from_options({"edge": 0}).reductions() == [
        "edge 0 < 0.015625"]
    with pytest.raises(UserError, match=r"square_budget \(400\) must be at least square_queries \(500\)"):
        LadderSpec.from_options({"square_budget": 400})
    with pytest.raises(UserError, match=r"square_budget \(999\) must be at least square_queries \(1000\)"):
        LadderSpec.from_options({"square_queries": 1000, "square_budget": 999})
    assert LadderSpec.from_options({"square_queries": 800, "square_budget": 800}).square_budget == 800
    with pytest.raises(UserError, match="steps must be >= 1, got 0"):
        LadderSpec.from_options({"steps": 0})
    for bad in (2.5, True, "many"):
        with pytest.raises(UserError, match="expected a whole number"):
            LadderSpec.from_options({"pool": bad})
    with pytest.raises(UserError, match="expected a number"):
        LadderSpec.from_options({"near": "far"})
    with pytest.raises(UserError, match=r"share in \[0, 0.05\]"):
        LadderSpec.from_options({"tol_share": 0.06})
    with pytest.raises(UserError, match=r"tol_min must be in \[0, 10\]"):
        LadderSpec.from_options({"tol_min": 11})
    assert LadderSpec.from_options({"steps": "25"}).steps == 25 and LadderSpec.from_options(None) == LadderSpec()


def test_a_tolerance_of_no_sample_is_accepted():
    """``--converge-opt tol_min=0`` with ``--converge-tol 0``: the last round may break no sample at all (a stricter
    ladder than the default; design 10 accepted it)."""
    spec = LadderSpec.from_options({"tol_min": 0, "tol_share": 0.0})
    assert spec.tolerance(1000) == 0 and spec.reductions() == []


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
                       (dict(converge_opt={"near": float("nan")}), r"near must be a share of the clean margin in"),
                       (dict(converge_opt={"near": 2}), r"near must be a share of the clean margin in \(0, 1\]"),
                       (dict(converge_opt={"square_budget": 100}),
                        r"square_budget \(100\) must be at least square_queries \(500\)"),
                       (dict(converge_opt={"unstable_rtol": 0.1}), r"unknown --converge-opt key\(s\) 'unstable_rtol'"),
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
    edited.write_text(text.replace(row, row.replace("| converged", "| not converged", 1), 1))
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


def _unit_records(units, tol_share=0.001, tol_min=1, **ladder):
    """Converge records of one condition, one dict of columns per unit over its defaults: 120 samples (``n``), all
    still robust, clean margin 4, the gradient families at 2 and Square at 3 (nothing near at tau 1/16), nothing
    flagged, without gradients or broken by the unit's last round; the unit's status ``converged``. A column given
    as {sample: value} sets those samples only."""
    params = json.dumps({"ladder": {**LadderSpec().as_dict(), "tol_share": tol_share, "tol_min": tol_min, **ladder},
                         "design": 11})
    defaults = {"correct_top1": True, "grad_unavailable": False, "margin_clean": 4.0, "margin_gradient": 2.0,
                "margin_free": 3.0, "converge_grad_misleads": False, "converge_full_gradient": False,
                "converge_full_free": False, "converge_last_broke": False, "converge_tau": 1 / 16,
                "converge_unstable": False, "converge_batch_dependent": False}
    frames = []
    for u, cols in enumerate(units):
        cols = dict(cols)
        n = cols.pop("n", 120)
        frame = {"unit": f"u{u}", "sample_id": [f"{u}-{i}" for i in range(n)], "params": params,
                 "converge_status": cols.pop("status", CONVERGED), "converge_detail": f"unit {u}"}
        for col, default in defaults.items():
            v = cols.pop(col, default)
            frame[col] = [v.get(i, default) for i in range(n)] if isinstance(v, dict) else v
        assert not cols, cols
        frames.append(pd.DataFrame(frame))
    return pd.concat(frames, ignore_index=True)


def _last_broke(*samples):
    """A unit's columns where its last round broke ``samples`` (no longer robust)."""
    return {"correct_top1": {i: False for i in samples}, "converge_last_broke": {i: True for i in samples}}


def test_the_condition_level_rule_sees_what_small_units_leave_to_their_last_round():
    """Each unit's ladder stops on its own tolerance (1 sample): three units whose last rounds each broke one sample
    left 3 of the condition's 360 to it, more than its tolerance of 1: not converged. The same rule, the same function
    (``stop_rule.verdict``), on all the condition's samples with the condition's tolerance: near samples owed a
    budget at their own unit's tau, and samples without gradients, summed over the units."""
    from robustbench_pid.results.summaries.converge import condition_status, condition_verdict

    each_one = _unit_records([_last_broke(119)] * 3)
    status, detail = condition_verdict(each_one)
    assert status == NOT_CONVERGED == condition_status(each_one)
    assert detail == ("every sample within tau = 0.0625 of its clean margin had the full budget and the last round "
                      "still broke 3 sample(s) (tolerance 1): the number is an upper bound; 3 of 3 work units "
                      "converged on their own")
    one = _unit_records([_last_broke(119), {}, {}])
    assert condition_verdict(one) == (CONVERGED, "every sample within tau = 0.0625 of its clean margin had each "
                                                 "family's full AutoAttack budget, and the last round broke 1 "
                                                 "sample(s) (tolerance 1); 3 of 3 work units converged on their own")
    # a larger condition has a larger tolerance (0.1% of 3,000 samples: 3)
    assert condition_status(_unit_records([{**_last_broke(999), "n": 1000}] * 3)) == CONVERGED
    assert condition_status(_unit_records([{**_last_broke(998, 999), "n": 1000}] * 2 + [{"n": 1000}])) == \
        NOT_CONVERGED
    # near at its own unit's tau and without that kind's full budget: owed (2 > 1); with it, not
    owed = _unit_records([{"margin_gradient": {5: 0.2}},  # 0.05 of the clean margin <= 1/16
                          {"margin_gradient": {5: 0.4}, "converge_tau": 1 / 8},  # 0.1 <= 1/8
                          {"margin_gradient": {5: 0.4}}])  # 0.1 > 1/16: not near in its unit
    assert condition_verdict(owed)[0] == NOT_CONVERGED
    assert condition_verdict(owed)[1].startswith("2 near or edge still-robust sample(s) did not get a family's full "
                                                 "budget or their fresh starts (tolerance 1)")
    served = _unit_records([{"margin_gradient": {5: 0.2}, "converge_full_gradient": {5: True}},
                            {"margin_gradient": {5: 0.4}, "converge_tau": 1 / 8},
                            {"margin_gradient": {5: 0.4}}])
    assert condition_status(served) == CONVERGED
    # Square nearer than the gradient families (2.5 < 3.0): owed Square's budget, not the gradient families'
    square = _unit_records([{"margin_gradient": {5: 3.0}, "margin_free": {5: 2.5}}] * 2)
    assert condition_status(square) == NOT_CONVERGED
    square["converge_full_free"] = True
    assert condition_status(square) == CONVERGED
    # robust samples without gradients beyond the condition's tolerance: an upper bound, though no unit saw more
    # than one; one on a broken sample does not count
    gradless = _unit_records([{"grad_unavailable": {0: True}}] * 3)
    assert condition_verdict(gradless)[0] == UPPER_BOUND and "on 3 still-robust sample(s) (tolerance 1)" in \
        condition_verdict(gradless)[1]
    broken = _unit_records([{"grad_unavailable": {0: True}}, {"grad_unavailable": {0: True}},
                            {"grad_unavailable": {0: True}, "correct_top1": {0: False}}])
    assert condition_status(broken) == UPPER_BOUND
    broken = _unit_records([{"grad_unavailable": {0: True}}, {"grad_unavailable": {0: True},
                                                              "correct_top1": {0: False}}])
    assert condition_status(broken) == CONVERGED
    # random or batch-dependent outputs in one unit: the condition is not converged
    assert condition_status(_unit_records([{}, {"converge_unstable": True}])) == RANDOM_OUTPUTS
    assert condition_status(_unit_records([{"converge_batch_dependent": True}, {}])) == BATCH_DEPENDENT


def test_a_unit_its_last_round_emptied_adds_no_breaks_to_its_condition():
    """A unit whose last round broke its last robust samples is converged on its own ("no sample is left robust":
    its number cannot fall further), so those breaks are no evidence that the condition's number could; design 10
    counted them as 0. Two such units and one whose last round broke 1: the condition broke 1 <= 1."""
    from robustbench_pid.results.summaries.converge import condition_status

    emptied = {"n": 120, "correct_top1": False, "converge_last_broke": {0: True, 1: True, 2: True}}
    g = _unit_records([_last_broke(119), emptied, emptied])
    assert condition_status(g[g["unit"] == "u1"]) == CONVERGED
    assert condition_status(g) == CONVERGED


def test_the_condition_sums_the_probes_flags_over_its_units_and_an_earlier_designs_records_get_their_worst_unit():
    """One probe-flagged still-robust sample per unit is within each unit's tolerance, but three over the
    condition's 360 samples are more than its tolerance of 1: the condition is an upper bound (gradients mislead);
    Square coming nearer than the gradient families is not (it is owed Square's budget, and had it). Records of a
    design before the rule was one function carry only their units' statuses: the worst of them."""
    from robustbench_pid.results.summaries.converge import MISLED, condition_verdict

    flagged = _unit_records([{"converge_grad_misleads": {7: True}}] * 3)
    status, detail = condition_verdict(flagged)
    assert status == MISLED and detail.startswith("the gradient probe flags 3 still-robust sample(s) (tolerance 1)")
    assert detail.endswith("; 3 of 3 work units converged on their own")
    one = _unit_records([{"converge_grad_misleads": {7: True}}, {"converge_grad_misleads": {7: True},
                                                                 "correct_top1": {7: False}}, {}])
    assert condition_verdict(one)[0] == CONVERGED  # a flag on a broken sample is no evidence about what is left
    nearer = _unit_records([{"margin_free": 1.0, "margin_gradient": 2.0, "converge_full_free": True}] * 3)
    assert condition_verdict(nearer)[0] == CONVERGED
    # flags and samples without gradients together: the latter come first
    both = _unit_records([{"converge_grad_misleads": {7: True}, "grad_unavailable": {8: True}}] * 3)
    assert condition_verdict(both)[0] == UPPER_BOUND
    # a reduced ladder's condition says so
    reduced = f"{REDUCED} (steps 25 < 100)"
    red = _unit_records([{"status": reduced}] * 3, steps=25)
    assert condition_verdict(red)[0] == reduced
    # an earlier design's records: no evidence columns, the worst unit status (and the units' details), never a
    # converged condition of several units
    from robustbench_pid.results.summaries.converge import EVIDENCE

    def old(*statuses):
        g = _unit_records([{"status": s} for s in statuses])
        return g.drop(columns=list(EVIDENCE))

    assert condition_verdict(old(CONVERGED, NOT_CONVERGED, CONVERGED)) == (NOT_CONVERGED, "unit 0; unit 1; unit 2")
    assert condition_verdict(old(CONVERGED, MISLED, NOT_CONVERGED))[0] == MISLED
    assert condition_verdict(old(MISLED, UPPER_BOUND, RANDOM_OUTPUTS))[0] == UPPER_BOUND
    # converged units of an earlier design cannot make a converged condition: this design cannot judge them together
    assert condition_verdict(old(CONVERGED, CONVERGED))[0] == NOT_CONVERGED
    assert "re-run them" in condition_verdict(old(CONVERGED, CONVERGED))[1]
    assert condition_verdict(old(reduced, reduced))[0] == NOT_CONVERGED
    assert condition_verdict(old(CONVERGED))[0] == CONVERGED  # one unit: its own status
    assert condition_verdict(old(reduced, CONVERGED))[0] == NOT_CONVERGED  # two ladders in one condition: neither
    # evidence columns but no recorded settings (no tolerance to judge by): the worst unit status too
    g = _unit_records([{"status": NOT_CONVERGED}, {}])
    g["params"] = "{}"
    assert condition_verdict(g)[0] == NOT_CONVERGED


def test_a_reduced_ladders_condition_is_never_called_converged_whatever_its_first_unit_said():
    """Three units of 1,000 samples (tolerance 1 each, 3 for the condition) of a reduced ladder (steps 25): the first
    unit's last round broke 2 (not converged on its own), the others none. The condition broke 2 <= 3: converged by
    the rule, but a reduced ladder's converged value must say so (``is_converged`` is False for it)."""
    from robustbench_pid.results.summaries.converge import condition_verdict, is_converged

    reduced = f"{REDUCED} (steps 25 < 100)"
    g = _unit_records([{**_last_broke(998, 999), "n": 1000, "status": NOT_CONVERGED},
                       {"n": 1000, "status": reduced}, {"n": 1000, "status": reduced}], steps=25)
    status, _ = condition_verdict(g)
    assert status == reduced and not is_converged(status)


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
    df = rbp.evaluate(model=copy.deepcopy(plain), data=(x[:64], y[:64]), attack="pgd", eps=EPS, steps=10,
                      converge=True, out=tmp_path / "bar", name="bar", mean=[0.0], std=[1.0], progress=True)
    rungs = int(df.loc[df["attack"] == "converge", "rung"].notna().sum())
    assert rungs >= 4 and len(seen) > rungs + 1  # every rung's batches and the probes moved it, not one jump per unit
    start, end = seen[0][0], seen[-1][0]
    full = next(t for t, n, total in seen if total and n >= total - 1e-6)
    assert (end - full) <= 0.2 * (end - start), (full - start, end - start)
    assert all(n <= total + 1e-6 for _, n, total in seen)


def _rungs_noted_at_the_bars_end(model, digits8, tmp_path, monkeypatch, opt):
    """The ladder's rung notes made while the bar stood at its total (work it had not made room for), and the notes."""
    import tqdm.auto

    notes = []

    class Watched(tqdm.auto.tqdm):  # type: ignore[misc,valid-type]
        def set_postfix_str(self, s="", refresh=True):
            notes.append((float(self.n), float(self.total or 0), str(s)))
            return super().set_postfix_str(s, refresh=refresh)

    monkeypatch.setattr(tqdm.auto, "tqdm", Watched)
    x, y = digits8
    rbp.evaluate(model=model, data=(x[:32], y[:32]), attack="pgd", eps=EPS, steps=10, converge=True, converge_opt=opt,
                 out=tmp_path / "bar", name="bar", mean=[0.0], std=[1.0], progress=True)
    ladder = [(n, total, s) for n, total, s in notes if " round " in s]
    return [s for n, total, s in ladder if total and n >= total - 1e-6], ladder


def test_the_bar_makes_room_for_each_rung_before_it_runs(plain, digits8, tmp_path, monkeypatch):
    at_end, notes = _rungs_noted_at_the_bars_end(copy.deepcopy(plain), digits8, tmp_path, monkeypatch, FAST)
    assert {s.split(" round ")[1].split(":")[0] for _, _, s in notes} >= {"1 apgd-t", "1 apgd-ce", "1 square"}
    assert at_end == []


def test_the_bar_makes_room_for_a_randomised_models_eot_rungs(plain, digits8, tmp_path, monkeypatch):
    """``Converge.passes``: EOT and SPSA "run only where called for: the bar makes room for each round as it is
    decided". A randomised model's EOT rungs (round 1; AutoAttack's 20 draws x 100 steps, twice) must not run behind
    a bar already at its end."""
    at_end, notes = _rungs_noted_at_the_bars_end(Dropout(copy.deepcopy(plain)), digits8, tmp_path, monkeypatch, {})
    assert any("eot-ce" in s for _, _, s in notes)
    assert at_end == [], at_end[:3]


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
