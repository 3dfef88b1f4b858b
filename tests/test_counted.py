"""Per-sample pass counts for the library attacks (Square, AutoAttack's components): ``Counted`` charges each
forwarded row to its nearest clean image, so a sample the attack broke early carries fewer passes than one it
kept attacking, and the counts still add up to every image the model saw."""
from __future__ import annotations

import pytest
import torch

from robustbench_pid.attacks import make_attack
from robustbench_pid.attacks.telemetry import Counted, Telemetry


def _model_and_data():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images[:40] / 16.0, dtype=torch.float32)[:, None]
    y = torch.tensor(d.target[:40])
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    for _ in range(150):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return net.eval(), x, y


def test_rows_are_charged_to_their_own_images_forward_and_backward():
    net, x, y = _model_and_data()
    c = Counted(net, x)
    sub = torch.tensor([3, 3, 7, 20])
    noisy = (x[sub] + 0.02 * torch.randn_like(x[sub])).clamp(0, 1)  # iterates near their own images
    with torch.no_grad():
        c(x)  # every image once
    xr = noisy.clone().requires_grad_(True)
    c(xr).sum().backward()
    want_f = torch.ones(len(x), dtype=torch.float64)
    want_f[3] += 2
    want_f[7] += 1
    want_f[20] += 1
    want_b = want_f - 1
    assert torch.equal(c.per_forward, want_f) and torch.equal(c.per_backward, want_b)
    t = Telemetry(len(x), torch.device("cpu"))
    c.settle(t)
    assert t.forward.tolist() == want_f.float().tolist() and t.backward.tolist() == want_b.float().tolist()
    assert c.n_forward == len(x) + 4 and c.n_backward == 4


def test_without_originals_or_with_foreign_rows_every_sample_gets_the_batch_mean():
    net, x, y = _model_and_data()
    c = Counted(net)
    with torch.no_grad():
        c(x[:10])
    t = Telemetry(20, torch.device("cpu"))
    c.settle(t)
    assert t.forward.tolist() == [0.5] * 20
    class AnyShape(torch.nn.Module):
        def forward(self, z: torch.Tensor) -> torch.Tensor:
            return z.flatten(1).mean(1, keepdim=True).expand(-1, 10)

    c = Counted(AnyShape(), x[:4])
    with torch.no_grad():
        c(x[:4])
        c(torch.zeros(2, 1, 4, 4))  # a shape the originals do not have: no owner, so no per-sample counts
    t = Telemetry(4, torch.device("cpu"))
    c.settle(t)
    assert t.forward.tolist() == [1.5] * 4


def test_square_charges_each_sample_its_own_queries():
    net, x, y = _model_and_data()
    with torch.no_grad():
        ok = net(x).argmax(1) == y
    x, y = x[ok], y[ok]
    attack = make_attack("square", eps=0.3, n_queries=200)
    x_adv = attack(net, x, y, bounds=(0.0, 1.0), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        broken = net(x_adv).argmax(1) != y
    fwd = attack.telemetry.forward
    assert broken.any() and (~broken).any()
    # a sample still robust was queried to the end; a broken one stopped when it broke
    assert float(fwd[~broken].min()) > float(fwd[broken].min())
    assert float(fwd[~broken].min()) >= 200
    assert len(set(fwd.tolist())) > 2  # not one batch mean for all


def test_identical_images_share_the_rows_no_nearness_can_tell_apart():
    """A dataset may hold one image twice: rows near both copies are pooled and split equally, instead of
    all going to the first copy (the total stays every image the model saw)."""
    net, x, y = _model_and_data()
    xb = torch.cat([x[:5], x[2:3]])  # row 5 is a copy of row 2
    c = Counted(net, xb)
    with torch.no_grad():
        c(xb)  # each row once: both copies' rows land on row 2 (argmin takes the first)
        c((xb[[2, 2, 2, 4]] + 0.01).clamp(0, 1))
    t = Telemetry(len(xb), torch.device("cpu"))
    c.settle(t)
    assert t.forward.tolist() == [1.0, 1.0, 2.5, 1.0, 2.0, 2.5]
    assert float(t.forward.sum()) == c.n_forward == 10


def test_the_class_count_probe_of_targeted_attacks_is_charged_and_clamped_targets_are_said():
    import warnings

    from robustbench_pid.attacks.autoattack._library import classes_of, n_targets

    net, x, y = _model_and_data()
    attack = make_attack("fab_t", eps=0.1, steps=2, targets=3)
    attack.telemetry = Telemetry(len(x), torch.device("cpu"))
    assert classes_of(attack, net, x) == 10
    assert attack.telemetry.forward.tolist() == [1.0] + [0.0] * (len(x) - 1)  # the first image's pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert n_targets(9, 10, "'apgd_t'") == 9  # within the classes: nothing said
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert n_targets(50, 10, "'apgd_t'") == 9
    assert len(w) == 1 and "targets=50" in str(w[0].message) and "targets=9" in str(w[0].message)

    class Rows(torch.nn.Module):  # every image the model sees, probe included
        def __init__(self) -> None:
            super().__init__()
            self.net, self.n = net, 0

        def forward(self, z: torch.Tensor) -> torch.Tensor:
            self.n += len(z)
            return self.net(z)

    seen = Rows()
    with torch.no_grad():
        ok = net(x).argmax(1) == y
    attack(seen, x[ok][:6], y[ok][:6], bounds=(0.0, 1.0), generator=torch.Generator().manual_seed(0))
    assert float(attack.telemetry.forward.sum()) == seen.n


def test_progress_keeps_each_samples_lowest_margin_inside_the_ball_and_what_its_last_half_gained():
    """Hand-made calls through ``Counted``: each forwarded row's verdict margin z_y - max z_j goes to its nearest
    clean image; rows outside that image's eps-ball are ignored (FAB steps outside and projects back); ``margin_half``
    is the lowest over the first half of the sample's passes, so ``margin_half - margin_best`` is the last half's gain."""

    class Shift(torch.nn.Module):
        """Logits (s, 0): the margin of class 0 is the first pixel's value s."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            s = x.flatten(1)[:, 0]
            return torch.stack([s, torch.zeros_like(s)], 1)

    x = torch.zeros(2, 1, 2, 2)
    x[1] += 0.5  # two images far apart (L-inf 0.5)
    y = torch.zeros(2, dtype=torch.long)
    c = Counted(Shift(), x, labels=y, eps=0.1)

    def rows(*vals):  # sample 0 at first-pixel offsets vals[0], sample 1 at vals[1], ...
        out = x[: len(vals)].clone()
        for i, v in enumerate(vals):
            out[i, 0, 0, 0] += v
        return out

    c(rows(0.05, 0.0))  # margins 0.05 | 0.5
    c(rows(0.02, -0.05))  # 0.02 | 0.45
    c(rows(-0.3, -0.08))  # outside sample 0's ball: ignored | 0.42
    c(rows(-0.01, -0.1))  # -0.01 (crossed) | 0.40
    p = c.progress()
    assert p["passes"].tolist() == [4.0, 4.0]
    assert p["margin_best"].tolist() == pytest.approx([-0.01, 0.40])
    assert p["margin_half"].tolist() == pytest.approx([0.02, 0.45])  # the first two passes of each
    assert Counted(Shift(), x).progress() is None  # without labels nothing is kept
