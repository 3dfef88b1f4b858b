"""Attacks under half-precision autocast (CPU bf16, as CI runs it) and on models with few classes: the
library attacks take fp32 logits, CW's paper-protocol variable is seen anew each step, DLR needs its classes."""
from __future__ import annotations

import pytest
import torch

import robustbench_pid as rbp
from robustbench_pid.attacks import make_attack
from robustbench_pid.errors import UserError


def test_square_runs_under_bf16_autocast_and_stays_in_the_ball(deit_model, digits_batch):
    x, y = digits_batch[0][:6], digits_batch[1][:6]
    xa = rbp.attack(deit_model, x, y, "square", n_queries=20, precision="bf16")
    assert xa.dtype == torch.float32 and (xa - x).abs().max() <= 8 / 255 + 1e-6
    assert 0 <= float(xa.min()) and float(xa.max()) <= 1


def test_cw_in_the_paper_protocol_under_bf16_moves_its_points(deit_model, digits_batch):
    """Autocast's cache kept the first bf16 copy of CW's Adam leaf: every step saw the start, and CW returned x
    for every sample (robust accuracy = clean accuracy). Now bf16 CW moves points as fp32 CW does."""
    x, y = digits_batch[0][:6], digits_batch[1][:6]
    moved = {}
    for precision in ("fp32", "bf16"):
        xa = rbp.attack(deit_model, x, y, "cw", protocol="paper", precision=precision, steps=5, search_steps=2)
        moved[precision] = int(((xa - x).flatten(1).norm(dim=1) > 1e-4).sum())
    assert moved["fp32"] > 0 and moved["bf16"] > 0


@pytest.mark.parametrize("classes,name,kw", [
    (3, "apgd_t", {"steps": 3}),
    (3, "apgd_ranked", {"steps": 3, "targets": 1, "pool": 2}),
    (2, "apgd_strong", {"loss": "dlr", "steps": 3, "restarts": 1}),
    (2, "apgd_eot", {"loss": "dlr", "steps": 3, "eot_iter": 1}),
])
def test_dlr_attacks_refuse_a_model_with_too_few_classes(classes, name, kw, digits_batch):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, classes)).eval()
    for p in net.parameters():
        p.requires_grad_(False)
    x = digits_batch[0][:4]
    with torch.no_grad():
        y = net(x).argmax(1)
    with pytest.raises(UserError, match=f"attack '{name}'.* needs a model of at least"):
        make_attack(name, **kw)(net, x, y, generator=torch.Generator().manual_seed(0))
