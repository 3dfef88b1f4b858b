"""White-box attacks (FGSM, PGD, PGD-L2, SLD, CW) on the embedded digits models, each beside an
independent reference: torchattacks, a loop written here, foolbox, a brute-force projection."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from robustbench_pid.attacks import make_attack
from robustbench_pid.attacks.base import margin_loss
from robustbench_pid.attacks.sld import project_l1_ball, top_percentile_mask


def _acc(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


@pytest.fixture(scope="module")
def batch32(digits_batch):
    x, y = digits_batch
    return x[:32], y[:32]


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# --- FGSM / PGD against torchattacks and a loop -----------------------------------------------
def test_fgsm_equals_torchattacks_sample_for_sample(deit_model, batch32):
    import torchattacks

    x, y = batch32
    eps = 4 / 255
    ours = make_attack("fgsm", eps=eps)(deit_model, x, y, generator=gen())
    ref = torchattacks.FGSM(deit_model, eps=eps)(x, y)
    assert torch.allclose(ours, ref, atol=1e-6)
    with torch.no_grad():
        assert torch.equal(deit_model(ours).argmax(1), deit_model(ref).argmax(1))


def test_pgd_no_random_start_equals_torchattacks(pid_model, batch32):
    import torchattacks

    x, y = batch32
    eps, alpha, steps = 3 / 255, 1 / 255, 7
    ours = make_attack("pgd", eps=eps, steps=steps, step_size=alpha, random_start=False,
                       early_stop=False)(pid_model, x, y, generator=gen())
    ref = torchattacks.PGD(pid_model, eps=eps, alpha=alpha, steps=steps, random_start=False)(x, y)
    assert (ours - ref).abs().max().item() < 1e-5
    with torch.no_grad():
        assert torch.equal(pid_model(ours).argmax(1), pid_model(ref).argmax(1))


def test_pgd_equals_a_plain_loop(deit_model, batch32):
    x, y = batch32
    eps, steps = 2 / 255, 5
    alpha = 0.15 * eps
    xr = x.clone()
    for _ in range(steps):
        xr.requires_grad_(True)
        loss = F.cross_entropy(deit_model(xr), y)
        (g,) = torch.autograd.grad(loss, xr)
        xr = torch.min(torch.max(xr.detach() + alpha * g.sign(), x - eps), x + eps).clamp(0, 1)
    ours = make_attack("pgd", eps=eps, steps=steps, step_size_factor=0.15, random_start=False,
                       early_stop=False)(deit_model, x, y, generator=gen())
    assert (ours - xr).abs().max().item() < 1e-5


@pytest.mark.parametrize("name", ["fgsm", "pgd"])
def test_linf_attacks_stay_in_ball_and_range(pid_model, batch32, name):
    x, y = batch32
    eps = 6 / 255
    xa = make_attack(name, eps=eps, **({"steps": 10} if name == "pgd" else {}))(pid_model, x, y, generator=gen())
    assert (xa - x).abs().max().item() <= eps + 1e-6
    assert xa.min().item() >= 0.0 and xa.max().item() <= 1.0
    assert _acc(pid_model, xa, y) < _acc(pid_model, x, y)


def test_pgd_accuracy_non_increasing_over_eps_grid(deit_model, pid_model, batch32):
    x, y = batch32
    for model in (deit_model, pid_model):
        # eps 0 is refused (it would only repeat clean accuracy): the clean images are the first point
        accs = [_acc(model, x, y)] + [
            _acc(model, make_attack("pgd", eps=i / 255, steps=5, random_start=False)(model, x, y, generator=gen()), y)
            for i in (3, 6)]
        assert all(b <= a for a, b in zip(accs, accs[1:])), accs
        assert accs[-1] < accs[0]


def test_pgd_l2_in_ball_and_effective(pid_model, batch32):
    x, y = batch32
    xa = make_attack("pgd_l2", eps=1.0)(pid_model, x, y, generator=gen())
    assert (xa - x).flatten(1).norm(dim=1).max().item() <= 1.0 + 1e-5
    assert xa.min().item() >= 0 and xa.max().item() <= 1
    assert _acc(pid_model, xa, y) < 0.5 * _acc(pid_model, x, y)


# --- SLD ------------------------------------------------------------------------------------
def _brute_l1_projection(v: np.ndarray, eps: float) -> np.ndarray:
    """argmin |w - v|_2 s.t. |w|_1 <= eps by enumerating supports (independent of Duchi's sort)."""
    if np.abs(v).sum() <= eps:
        return v.copy()
    best, best_d = None, np.inf
    d = len(v)
    s = np.sign(v)
    for mask in range(1, 2 ** d):
        idx = [i for i in range(d) if mask >> i & 1]
        a = np.abs(v[idx])
        theta = (a.sum() - eps) / len(idx)  # KKT on this support, active constraint
        w = np.zeros(d)
        w[idx] = s[idx] * (a - theta)
        if theta < 0 or (a - theta < -1e-12).any():
            continue
        dist = np.sum((w - v) ** 2)
        if dist < best_d:
            best, best_d = w, dist
    return best


def test_l1_projection_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(200):
        d = int(rng.integers(1, 7))
        v = rng.normal(size=d) * rng.uniform(0.1, 3)
        eps = float(rng.uniform(0.05, 3))
        ours = project_l1_ball(torch.tensor(v[None], dtype=torch.float64), eps)[0].numpy()
        ref = _brute_l1_projection(v, eps)
        assert np.allclose(ours, ref, atol=1e-9), (v, eps, ours, ref)
        assert np.abs(ours).sum() <= eps + 1e-9


def test_l1_projection_is_not_a_rescale():
    v = torch.tensor([[3.0, 1.0, 0.1]])
    w = project_l1_ball(v, 2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 0.0, 0.0]]))  # sparse: soft threshold at 1


def test_sld_l1_norm_never_exceeds_eps(pid_model, batch32):
    x, y = batch32
    for eps in (1.0, 10.0):
        xa = make_attack("sld", eps=eps, iterations=5)(pid_model, x, y, generator=gen())
        assert (xa - x).flatten(1).abs().sum(1).max().item() <= eps * (1 + 1e-5)
        assert xa.min().item() >= 0 and xa.max().item() <= 1


def test_sld_step_changes_only_top_coordinates(pid_model, batch32):
    x, y = batch32
    q = 99.0
    z = pid_model.normalize(x)
    net = pid_model.net
    za = make_attack("sld", eps=1e6, step_size=1.0, iterations=1, q=q)(net, z, y, bounds=None, generator=gen())
    changed = (za != z).flatten(1)
    zr = z.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(F.cross_entropy(net(zr), y, reduction="sum"), zr)
    expected = top_percentile_mask(g, q).flatten(1) & (g.flatten(1) != 0)
    d = changed.shape[1]
    assert torch.equal(changed, expected)
    assert changed.sum(1).max().item() <= math.ceil((100 - q) / 100 * d)
    # one step has L1 length exactly step_size
    assert torch.allclose((za - z).flatten(1).abs().sum(1), torch.ones(len(z)), atol=1e-4)


def test_sld_clip_grad_zeroes_outward_gradients(pid_model, batch32):
    x, y = batch32
    xa = make_attack("sld", eps=50.0, step_size=5.0, iterations=1, clip_grad=True)(pid_model, x, y, generator=gen())
    moved = (xa != x)
    # with clip_grad, no step was spent on pixels at a bound pushed outwards: every moved pixel really moved
    assert moved.any()
    assert ((xa - x).abs()[moved] > 0).all()
    at_bound = (x == 0) | (x == 1)
    clipped_nothing = (x + 0 == x)
    assert clipped_nothing.all()
    # pixels at 0 can only have moved up, pixels at 1 only down
    assert (xa[(x == 0) & moved] > 0).all() and (xa[(x == 1) & moved] < 1).all()
    assert at_bound.any()


def test_sld_accuracy_close_to_foolbox(pid_model, digits_batch):
    import foolbox as fb

    x, y = digits_batch
    eps, steps, step = 2.0, 10, 0.5
    ours = make_attack("sld", eps=eps, step_size=step, iterations=steps, q=99.0, clip_grad=True)(
        pid_model, x, y, generator=gen())
    # foolbox moves the model it is given to its device in place (cuda:0 when there is one): give
    # it a copy, on the batch's device, so the session-wide fixture stays where it is
    fmodel = fb.PyTorchModel(copy.deepcopy(pid_model).eval(), bounds=(0, 1), device=x.device)
    attack = fb.attacks.SparseL1DescentAttack(quantile=0.99, abs_stepsize=step, steps=steps, random_start=False)
    _, clipped, _ = attack(fmodel, x, y, epsilons=eps)
    acc_ours, acc_ref = _acc(pid_model, ours, y), _acc(pid_model, clipped, y)
    assert abs(acc_ours - acc_ref) <= 0.05, (acc_ours, acc_ref)
    assert acc_ours < _acc(pid_model, x, y) - 0.1


# --- CW -------------------------------------------------------------------------------------
def test_margin_is_right_for_negative_logits():
    logits = torch.tensor([[-5.0, -1.0, -3.0], [-2.0, -9.0, -4.0]])
    y = torch.tensor([0, 0])
    # max over the other classes: -1 (row 0) and -4 (row 1); a one-hot product would give 0
    assert torch.allclose(margin_loss(logits[:1], y[:1]), torch.tensor(-1.0 - -5.0))
    assert torch.allclose(margin_loss(logits[1:], y[1:]), torch.tensor(-4.0 - -2.0))
    from robustbench_pid.attacks.spsa import margin

    assert torch.allclose(margin(logits, y), torch.tensor([-4.0, 2.0]))


def test_cw_lowers_accuracy_within_l2_budget(pid_model, batch32):
    x, y = batch32
    x, y = x[:16], y[:16]
    eps = 1.0
    xa = make_attack("cw", eps=eps, steps=15, search_steps=2, c_init=1.0)(pid_model, x, y, generator=gen())
    norms = (xa - x).flatten(1).norm(dim=1)
    assert norms.max().item() <= eps + 1e-5
    assert xa.min().item() >= 0 and xa.max().item() <= 1
    assert _acc(pid_model, xa, y) < 0.5 * _acc(pid_model, x, y)
    # a zero budget leaves the images alone
    x0 = make_attack("cw", eps=1e-4, steps=3, search_steps=1)(pid_model, x, y, generator=gen())
    assert torch.equal(x0, x)


@pytest.mark.parametrize("name", ["fgsm", "pgd", "apgd_ce", "apgd_ranked", "fab_t", "square", "spsa", "cw"])
def test_an_empty_batch_comes_back_empty_with_no_passes(name, deit_model, batch32):
    """A ladder round or a shard can hand an attack no sample; the library attacks indexed the first row (Square
    crashed in its pass counter's torch.cat of nothing)."""
    x, y = batch32
    atk = make_attack(name, eps=4 / 255)
    out = atk(deit_model, x[:0], y[:0], generator=gen())
    assert out.shape == (0,) + tuple(x.shape[1:])
    assert atk.telemetry is None or (atk.telemetry.forward.numel() == 0 and atk.telemetry.backward.numel() == 0)
