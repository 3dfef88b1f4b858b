"""Score-based and ensemble attacks (SPSA, Square, AutoAttack) and uniform noise: they lower
accuracy on the embedded models, stay in the ball and the range, and are reproducible from a seed."""
from __future__ import annotations

import pytest
import torch

from robustbench_pid.attacks import make_attack
from robustbench_pid.attacks.spsa import margin


def _acc(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


@pytest.fixture(scope="module")
def batch16(digits_batch):
    x, y = digits_batch
    return x[:16], y[:16]


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _check_linf(x, xa, eps, lo=0.0, hi=1.0):
    assert (xa - x).abs().max().item() <= eps + 1e-6
    assert xa.min().item() >= lo and xa.max().item() <= hi


def test_spsa_gradient_is_estimated_at_the_current_point(pid_model, batch16):
    """cleverhans#1249 estimated at 2x; ours must track the true gradient at x + delta."""
    x, y = batch16
    x = x[:2]
    y = y[:2]
    point = (x + 0.05 * (2 * torch.rand(x.shape, generator=gen(1)) - 1)).clamp(0, 1)
    a = make_attack("spsa", n_samples=512, fd_delta=0.001)
    est = a.estimate_gradient(pid_model, point, y, gen(2))
    p = point.clone().requires_grad_(True)
    (true,) = torch.autograd.grad(margin(pid_model(p), y).sum(), p)
    cos = torch.nn.functional.cosine_similarity(est.flatten(1), true.flatten(1))
    assert (cos > 0.2).all(), cos  # ~sqrt(k / (k + d)) = 0.38 expected for an unbiased estimate
    # at 2x (the cleverhans bug) the same estimator points somewhere else
    far = a.estimate_gradient(pid_model, (2 * point), y, gen(2))
    cos_far = torch.nn.functional.cosine_similarity(far.flatten(1), true.flatten(1))
    assert (cos_far < cos).all()


def test_spsa_lowers_accuracy_in_ball_and_reproducible(pid_model, batch16):
    x, y = batch16
    x, y = x[:8], y[:8]
    eps = 16 / 255
    a = make_attack("spsa", eps=eps, iterations=8, n_samples=8, lr=0.02)
    xa = a(pid_model, x, y, generator=gen(3))
    _check_linf(x, xa, eps)
    assert _acc(pid_model, xa, y) < _acc(pid_model, x, y) - 0.2
    assert torch.equal(xa, a(pid_model, x, y, generator=gen(3)))
    assert not torch.equal(xa, a(pid_model, x, y, generator=gen(4)))


def test_spsa_unbounded_in_paper_space(pid_model, batch16):
    x, y = batch16
    z = pid_model.normalize(x)
    za = make_attack("spsa", eps=0.1, iterations=3, n_samples=8, early_stop=False)(
        pid_model.net, z, y, bounds=None, generator=gen())
    assert (za - z).abs().max().item() <= 0.1 + 1e-6
    assert za.min().item() < -1.0  # below the image of pixel 0: no clipping in normalized space


def test_square_lowers_accuracy_in_ball_and_reproducible(deit_model, batch16):
    x, y = batch16
    x, y = x[:8], y[:8]
    eps = 32 / 255
    a = make_attack("square", eps=eps, n_queries=30)
    before = torch.random.get_rng_state()
    xa = a(deit_model, x, y, generator=gen(5))
    assert torch.equal(before, torch.random.get_rng_state())  # global RNG restored
    _check_linf(x, xa, eps)
    assert _acc(deit_model, xa, y) < _acc(deit_model, x, y) - 0.2
    assert torch.equal(xa, a(deit_model, x, y, generator=gen(5)))
    assert not torch.equal(xa, a(deit_model, x, y, generator=gen(6)))


def test_square_unbounded_mode_is_exact(deit_model, batch16):
    """The affine map into [0, 1] keeps the ball exact and never clips (paper protocol)."""
    x, y = batch16
    x, y = x[:8], y[:8]
    z = deit_model.normalize(x)
    eps = 0.3
    za = make_attack("square", eps=eps, n_queries=20)(deit_model.net, z, y, bounds=None, generator=gen())
    d = (za - z).abs()
    assert d.max().item() <= eps * (1 + 1e-5)
    assert za.min().item() < z.min().item() - 0.5 * eps  # went below the clean minimum: not clipped
    assert _acc(deit_model.net, za, y) < _acc(deit_model.net, z, y)


def test_noise_is_uniform_in_ball_and_seeded(pid_model, batch16):
    x, y = batch16
    a = make_attack("noise", eps=0.3)
    assert a.worst_case is False
    xa = a(pid_model, x, y, bounds=None, generator=gen(7))
    d = (xa - x)
    assert d.abs().max().item() <= 0.3 and d.abs().max().item() > 0.29
    assert abs(d.mean().item()) < 0.01 and abs(d.abs().mean().item() - 0.15) < 0.01  # U(-0.3, 0.3)
    assert torch.equal(xa, a(pid_model, x, y, bounds=None, generator=gen(7)))
    xc = a(pid_model, x, y, generator=gen(7))
    assert xc.min().item() >= 0 and xc.max().item() <= 1


@pytest.mark.slow
def test_autoattack_at_most_pgd_in_ball_and_reproducible(pid_model, digits_batch):
    x, y = digits_batch
    x, y = x[:24], y[:24]
    eps = 4 / 255
    aa = make_attack("autoattack", eps=eps)
    before = torch.random.get_rng_state()
    xa = aa(pid_model, x, y, generator=gen(8))
    assert torch.equal(before, torch.random.get_rng_state())
    _check_linf(x, xa, eps)
    xp = make_attack("pgd", eps=eps, steps=20)(pid_model, x, y, generator=gen(8))
    acc_aa, acc_pgd, acc_clean = _acc(pid_model, xa, y), _acc(pid_model, xp, y), _acc(pid_model, x, y)
    assert acc_aa <= acc_pgd < acc_clean
    assert torch.equal(xa, aa(pid_model, x, y, generator=gen(8)))


def test_autoattack_refuses_other_versions():
    from robustbench_pid.errors import UserError

    with pytest.raises(UserError, match="standard"):
        make_attack("autoattack", version="rand")


def test_spsa_slice_size_never_changes_the_result(pid_model, batch16):
    """The probe slice (``max_batch``) is memory and speed only: it is left out of a condition's
    identity, so every slice size must give the same adversarial images (CPU)."""
    from robustbench_pid.attacks.spsa import AUTO_SLICE_CPU

    x, y = batch16
    outs = [make_attack("spsa", eps=0.1, iterations=3, n_samples=16, max_batch=mb)(
        pid_model, x, y, generator=torch.Generator().manual_seed(3)) for mb in (0, 40, 4096)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    assert make_attack("spsa").slice_size(torch.device("cpu")) == AUTO_SLICE_CPU == 256
    assert make_attack("spsa", max_batch=64).slice_size(torch.device("cpu")) == 64
