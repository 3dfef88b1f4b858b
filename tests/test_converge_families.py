"""The convergence ladder on models built to fool one attack family: gradients that point the wrong way (only
the gradient-free search breaks it), outputs that depend on the batch, and the ranked-target APGD-T that the
ladder's cost rests on (its ranking checked against the exact boundary distances of a linear model).

The models are small MLPs on scikit-learn's 8x8 digits, so the default ladder runs in seconds on a CPU."""
from __future__ import annotations

import copy

import pytest
import torch

import robustbench_pid as rbp
from robustbench_pid.attacks import make_attack
from robustbench_pid.attacks.autoattack.apgd_ranked import rank_targets
from robustbench_pid.models.gradient_wrappers import NoisyGradient, SignFlipped
from robustbench_pid.results.summaries.converge import BATCH_DEPENDENT, CONVERGED, MISLED

EPS = 0.1


Flipped = SignFlipped  # the names the tests of this file and test_converge_ground_truth.py use
Noisy = NoisyGradient


class BatchCentred(Flipped):
    """Logits minus their batch mean: a sample's output depends on the other samples of its batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.net(x)
        return z - z.mean(0, keepdim=True)


def _ladder(model, digits8, tmp_path, name, n=64, **kw):
    x, y = digits8
    df = rbp.evaluate(model=model, data=(x[:n], y[:n]), attack="pgd", eps=EPS, steps=10, converge=True,
                      out=tmp_path / name, name=name, mean=[0.0], std=[1.0], quiet=True, **kw)
    rec = rbp.load_records(df.attrs["run_dir"])
    row = df[(df["benchmark"] == "converge") & (df["metric"] == "top1")].iloc[0]
    return row, rec[rec["benchmark"] == "converge"].reset_index(drop=True)


def test_gradients_pointing_away_fool_the_gradient_rungs_but_not_the_ladder(plain, digits8, tmp_path):
    """Judged against ground truth, not against what a search can reach: the plain model's converged value on the same
    samples. With the gradient sign-flipped (forward unchanged) the ladder either is not ``converged`` or lands within
    3 samples of it. (Design 4 was judged against "what Square-5000 breaks under five seeds", the reach of a random
    search, and said converged far above the truth on a zoo model.) Here the probe names the misleading gradients."""
    x, y = digits8
    model = Flipped(copy.deepcopy(plain)).eval()
    assert torch.equal(model(x[:64]), plain(x[:64]))  # the same function
    xg = x[:64].clone().requires_grad_(True)
    (g,) = torch.autograd.grad(torch.nn.functional.cross_entropy(model(xg), y[:64]), xg)
    assert torch.isfinite(g).all() and (g.flatten(1).abs().amax(1) > 0).all()  # gradients exist: not "unavailable"
    truth, _ = _ladder(copy.deepcopy(plain), digits8, tmp_path, "plain")
    assert truth["status"] == CONVERGED
    row, rec = _ladder(model, digits8, tmp_path, "flipped")
    assert row["status"] != CONVERGED or abs(row["value"] - truth["value"]) <= 3 * 100 / 64, (row["status"], row["value"])
    assert row["status"] == MISLED and "step along the gradient" in row["status_detail"]
    robust = rec["correct_top1"].astype(bool)
    assert int((rec["converge_grad_misleads"].astype(bool) & robust).sum()) > rec["converge_tolerance"].iloc[0]
    assert not rec["grad_unavailable"].any()
    assert "square" in rec["converge_rungs"].iloc[0].split(",")  # the gradient-free search had its turn


def test_a_gradient_that_is_mostly_noise_is_detected_as_random_and_never_converged_above_the_truth(plain, digits8,
                                                                                                    tmp_path):
    """g + 3 ||g|| u (u a random unit direction, fresh at every backward pass; forward unchanged): the probe finds
    the gradients random, the EOT rungs run, and the ladder is not ``converged`` or within 3 samples of the plain
    model's converged value."""
    truth, _ = _ladder(copy.deepcopy(plain), digits8, tmp_path, "plain")
    row, rec = _ladder(Noisy(copy.deepcopy(plain)).eval(), digits8, tmp_path, "noisy")
    assert bool(rec["converge_random_gradients"].iloc[0])
    assert {"eot-ce", "eot-dlr"} <= set(rec["converge_rungs"].iloc[0].split(","))
    assert row["status"] != CONVERGED or abs(row["value"] - truth["value"]) <= 3 * 100 / 64, (row["status"], row["value"])
    _, rec_p = _ladder(copy.deepcopy(plain), digits8, tmp_path, "plain")
    assert not bool(rec_p["converge_random_gradients"].iloc[0])


def test_a_model_whose_outputs_depend_on_the_batch_is_never_converged(plain, digits8, tmp_path):
    row, rec = _ladder(BatchCentred(copy.deepcopy(plain)), digits8, tmp_path, "centred", n=32)
    assert row["status"] == BATCH_DEPENDENT and "other samples in its batch" in row["status_detail"]
    assert bool(rec["converge_batch_dependent"].iloc[0])
    # the same network without the batch statistic: converged, and not flagged
    row, rec = _ladder(copy.deepcopy(plain), digits8, tmp_path, "plain", n=32)
    assert row["status"] == CONVERGED and not bool(rec["converge_batch_dependent"].iloc[0])


def test_the_ranking_is_the_exact_boundary_distance_on_a_linear_model():
    """For logits W x + b the linearised L-inf distance to the y/t boundary is exact: (z_y - z_t) / ||w_y - w_t||_1."""
    torch.manual_seed(1)
    lin = torch.nn.Linear(20, 10)
    x = torch.rand(16, 20)
    with torch.no_grad():
        z = lin(x)
    y = z.argmax(1)
    order = rank_targets(lin, x, y, pool=9)
    w = lin.weight.detach()
    for i in range(len(x)):
        others = [t for t in range(10) if t != int(y[i])]
        d = {t: float((z[i, y[i]] - z[i, t]) / (w[y[i]] - w[t]).abs().sum()) for t in others}
        assert order[i].tolist() == sorted(others, key=d.get)
    assert rank_targets(lin, x, y, pool=3).shape == (16, 3)  # only the 3 highest logits are candidates


def test_ranked_targets_break_what_the_logit_order_misses_at_the_same_cost(plain, digits8):
    """On the MLP, the two nearest targets by boundary distance break at least as many samples as the two highest
    logits (AutoAttack's order) with the same iterations, and the attack counts its ranking passes."""
    x, y = digits8
    x, y = x[:96], y[:96]
    eps = 0.08
    ranked = make_attack("apgd_ranked", eps=eps, steps=50, targets=2)
    by_logit = make_attack("apgd_t", eps=eps, steps=50, targets=2)
    with torch.no_grad():
        r = plain(ranked(plain, x, y, generator=torch.Generator().manual_seed(0))).argmax(1) == y
        t = plain(by_logit(plain, x, y, generator=torch.Generator().manual_seed(0))).argmax(1) == y
    assert int(r.sum()) <= int(t.sum())
    assert ranked.telemetry.backward.max() >= 9  # the 9 ranking passes are charged
    best = ranked.stats["best_loss"]
    with torch.no_grad():
        clean = plain(x).argmax(1) == y
    assert best.shape == (96,) and bool(torch.isfinite(best[clean]).all()) and bool(torch.isinf(best[~clean]).all())
    assert not bool((r & (best > 0)).any())  # a target's margin crossed means the sample is broken


def test_ranked_nearness_is_read_from_the_run_without_a_pass_of_its_own(plain, digits8, monkeypatch):
    """Design 8: the DLR loss at each target's best point comes from the logits the library's run computed (its
    x_best rule replayed), equal to a forward pass at that point, and the attack makes no such pass: its forward
    passes per sample are the ranking's and one per iteration and target (+1 for the run's start)."""
    from pyautoattack.autopgd_base import APGDAttack_targeted

    from robustbench_pid.attacks.base import dlr_losses

    x, y = digits8
    with torch.no_grad():
        ok = plain(x[:64]).argmax(1) == y[:64]
    x, y = x[:64][ok][:24], y[:64][ok][:24]
    runs = []
    single = APGDAttack_targeted.attack_single_run

    def keep(self, xs, ys, *a, **k):
        out = single(self, xs, ys, *a, **k)
        runs.append((self.y_target.clone(), ys.clone(), out[0].detach().clone()))
        return out

    monkeypatch.setattr(APGDAttack_targeted, "attack_single_run", keep)
    steps, targets = 10, 3
    att = make_attack("apgd_ranked", eps=0.05, steps=steps, targets=targets)
    att(plain, x, y, generator=torch.Generator().manual_seed(0))
    reach = att.stats["target_reach"]
    assert len(runs) >= 2
    attacked = torch.isfinite(reach)
    seen = 0
    for k in range(targets):
        rows = attacked[:, k].nonzero().squeeze(1)
        if not len(rows):
            continue
        target, ys, x_best = runs[seen]
        seen += 1
        assert torch.equal(target, att.stats["target_order"][rows, k])
        with torch.no_grad():
            want = dlr_losses(plain(x_best), ys)
        assert torch.allclose(reach[rows, k], want, atol=1e-5), (k, reach[rows, k], want)
    # forward passes per sample: the ranking's (the clean check reads it), then steps + 1 per target it had
    runs_per_sample = attacked[:, :targets].sum(1).float()
    assert torch.equal(att.telemetry.forward.cpu().float(), 1 + runs_per_sample * (steps + 1)
                       + (torch.arange(len(x)) == 0).float())  # + the class count's pass, charged to sample 0


def test_square_nearness_and_clean_check_come_from_passes_the_library_makes(plain, digits8):
    """Design 8: Square's nearness is the DLR loss at the first run's best point (restored from its sign pattern
    here) or the clean point, whichever is nearer, without passes of its own; and the library's clean check is
    answered with the wrapper's own clean pass: per attacked sample, 1 clean pass, the run's start and iterations,
    and the library's check of the run's best point (before: 3 passes more)."""
    from robustbench_pid.attacks.base import dlr_losses

    x, y = digits8
    x, y = x[:48], y[:48]
    eps, q = 0.06, 60
    sq = make_attack("square", eps=eps, n_queries=q)
    sq(plain, x, y, generator=torch.Generator().manual_seed(0))
    best = (x + eps * sq.stats["signs"].float()).clamp(0, 1)
    with torch.no_grad():
        attacked = plain(x).argmax(1) == y
        want = torch.maximum(dlr_losses(plain(x), y), torch.where(attacked, dlr_losses(plain(best), y),
                                                                   torch.full_like(y, -1e9, dtype=torch.float)))
    assert torch.allclose(sq.stats["best_loss"], want, atol=1e-5)
    fwd = sq.telemetry.forward.cpu()
    assert bool((fwd[~attacked.cpu()] == 1).all())  # the clean pass only: the library's own check is answered
    # the clean pass, the run's start, at most q iterations (a fooled sample leaves early) and the library's check
    assert float(fwd[attacked.cpu()].max()) == q + 3


def test_fab_t_later_targets_attack_the_next_classes_by_logit(plain, digits8):
    x, y = digits8
    x, y = x[:32], y[:32]
    first = make_attack("fab_t", eps=EPS, steps=20, targets=1)
    second = make_attack("fab_t", eps=EPS, steps=20, targets=1, first=2)
    assert second.describe() == "FAB-T-20 (target 2 by logit)" and first.describe() == "FAB-T-20 (1 target)"
    for a in (first, second):
        x_adv = a(plain, x, y, generator=torch.Generator().manual_seed(0))
        assert float((x_adv - x).abs().max()) <= EPS + 1e-6
    both = make_attack("fab_t", eps=EPS, steps=20, targets=2)
    with torch.no_grad():
        one = plain(first(plain, x, y, generator=torch.Generator().manual_seed(0))).argmax(1) == y
        two = plain(second(plain, x, y, generator=torch.Generator().manual_seed(0))).argmax(1) == y
        pair = plain(both(plain, x, y, generator=torch.Generator().manual_seed(0))).argmax(1) == y
    assert int((one & two).sum()) == int(pair.sum())  # targets 1 then 2 = the library's two-target loop


def test_square_reports_how_near_it_came_so_the_ladder_can_rank_samples_gradients_misjudge(plain, digits8):
    """Square's ``best_loss`` is the scale-free DLR margin at its best point: > 0 where it fooled the model, at or
    above the clean point's margin elsewhere, and the same for the plain model and its gradient-flipped twin (a
    search needs no gradient, so the ranking of later rounds does not rest on gradients the model can fake)."""
    from robustbench_pid.attacks.base import dlr_losses

    x, y = digits8
    x, y = x[:48], y[:48]
    near = {}
    for name, model in (("plain", plain), ("flipped", Flipped(copy.deepcopy(plain)).eval())):
        sq = make_attack("square", eps=EPS, n_queries=200)
        x_adv = sq(model, x, y, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            fooled = model(x_adv).argmax(1) != y
            clean = dlr_losses(model(x), y)
        near[name] = sq.stats["best_loss"]
        assert bool(fooled.any()) and bool((~fooled).any())
        assert bool((near[name][fooled] > 0).all()) and bool((near[name][~fooled] <= 0).all())
        assert bool((near[name] >= clean - 1e-6).all())
    assert torch.allclose(near["plain"], near["flipped"])


class InputNoise(Flipped):
    """A randomised model: uniform input noise of +-``eps`` at every forward pass (its own seeded generator)."""

    def __init__(self, net: torch.nn.Module, eps: float = 8 / 255) -> None:
        super().__init__(net)
        self.eps, self.gen = eps, torch.Generator().manual_seed(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = (torch.rand(x.shape, generator=self.gen) * 2 - 1).to(x) * self.eps
        return self.net(x + noise)


def test_randomness_is_not_batch_dependence_and_gradient_probes_tell_healthy_from_flipped(plain, digits8):
    """The batch probe compares a sample's logits in other company with what a repeated pass of the same batch
    differs by: input noise at every pass is randomness (the EOT rungs' case), a batch statistic is dependence.
    The gradient probes: two backward passes differ only for a random gradient; a tiny step along the gradient
    raises the DLR loss more than the step against it on the plain model, and less on its sign-flipped twin."""
    from robustbench_pid.benchmarks.ladder.probes import (batch_dependent, gradient_draws, gradients_mislead,
                                                          gradients_random)

    x, y = digits8
    x, y = x[:32], y[:32]
    noisy_in = InputNoise(copy.deepcopy(plain)).eval()
    with torch.no_grad():
        z = noisy_in(x)
        assert not torch.equal(noisy_in(x), z)  # randomised
        assert not batch_dependent(noisy_in, x, z, rtol=1e-2)
        centred = BatchCentred(copy.deepcopy(plain)).eval()
        assert batch_dependent(centred, x, centred(x), rtol=1e-2)
        assert not batch_dependent(plain, x, plain(x), rtol=1e-2)
    assert gradients_random(Noisy(copy.deepcopy(plain)), x, y, 1e-3) and not gradients_random(plain, x, y, 1e-3)
    # two draws of g + 3 ||g|| u agree about as 1 / (1 + 9): mostly noise; a deterministic gradient agrees exactly
    _, cos = gradient_draws(Noisy(copy.deepcopy(plain)), x, y, 1e-3)
    assert float(cos.max()) < 0.5
    _, cos = gradient_draws(plain, x, y, 1e-3)
    assert torch.allclose(cos, torch.ones_like(cos))
    with torch.no_grad():
        ok = plain(x).argmax(1) == y
    assert int(gradients_mislead(plain, x[ok], y[ok]).sum()) == 0
    assert bool(gradients_mislead(Flipped(copy.deepcopy(plain)), x[ok], y[ok]).all())
    # design 8: the probes share one pass of gradients; the answers are those of their own passes
    from robustbench_pid.benchmarks.ladder.probes import batch_probe_rows, gradients_unavailable, input_gradients, \
        unavailable

    for model in (plain, Flipped(copy.deepcopy(plain)).eval()):
        g_ce, g_dlr = input_gradients(model, x[ok], y[ok])
        assert torch.equal(unavailable(g_ce, g_dlr, int(ok.sum()), x.device), gradients_unavailable(model, x[ok], y[ok]))
        assert torch.equal(gradients_mislead(model, x[ok], y[ok], grad=g_dlr), gradients_mislead(model, x[ok], y[ok]))
    noisy = Noisy(copy.deepcopy(plain))
    g_ce, _ = input_gradients(noisy, x, y)
    differ, cos = gradient_draws(noisy, x, y, 1e-3, first=g_ce)
    assert differ and float(cos.max()) < 0.5
    g_ce, _ = input_gradients(plain, x, y)
    differ, cos = gradient_draws(plain, x, y, 1e-3, first=g_ce)
    assert not differ and torch.allclose(cos, torch.ones_like(cos))
    # the batch probe's other company is a few samples: 4 alone and 8 as a batch of their own
    assert batch_probe_rows(32) == (4, 8) and batch_probe_rows(5) == (4, 5) and batch_probe_rows(1) == (0, 0)
    calls = []

    class Counting(torch.nn.Module):
        def forward(self, t):
            calls.append(len(t))
            return plain(t)

    with torch.no_grad():
        assert not batch_dependent(Counting(), x, plain(x), rtol=1e-2, again=plain(x))
    assert sorted(calls) == [1, 1, 1, 1, 8]
