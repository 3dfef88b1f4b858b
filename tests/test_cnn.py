"""The zoo's CNN, ``cnn_at`` (issue 56 item 4): a small conv net (three conv + ReLU + max-pool blocks, then fully
connected) that normalizes inside and takes [0, 1] digits; its shipped weights are PGD adversarially trained at
the recipe's large eps, where PGD-20 leaves a share of the test digits robust; its converge-grid cells hold
AutoAttack and the reference ensemble on all 360 test digits, made with the shipped file."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import timm
import torch
from torch import nn

import robustbench_pid as rbp
from robustbench_pid.attacks import make_attack
from robustbench_pid.core.labels import parse_eps
from robustbench_pid.errors import UserError
from robustbench_pid.hub.checkpoints import read_manifest
from robustbench_pid.models.cnn import SmallCNN
from robustbench_pid.models.zoo import resolve_model
from robustbench_pid.train.recipes import Adversarial, alias_recipe

ROOT = Path(__file__).resolve().parents[1]


def _converge_doc():
    spec = importlib.util.spec_from_file_location("converge_doc", ROOT / "scripts" / "converge_doc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def digits():
    ds = rbp.load_dataset("digits", split="test")
    return ds.images, ds.labels


@pytest.fixture(scope="module")
def cnn():
    return rbp.load_model("cnn_at")


def _pgd20_robust(model, x, y, eps: float) -> torch.Tensor:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x_adv = make_attack("pgd", eps=eps, steps=20)(model, x, y, bounds=(0.0, 1.0),
                                                      generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            return model(x_adv).argmax(1) == y
    finally:
        torch.set_num_threads(threads)


def test_the_cnn_is_three_conv_blocks_then_two_linear_layers_and_normalizes_inside(cnn) -> None:
    net = timm.create_model("cnn_digits_32", num_classes=10)
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.padding) for c in convs] == [
        (3, 32, (3, 3), (1, 1)), (32, 64, (3, 3), (1, 1)), (64, 64, (3, 3), (1, 1))]
    assert [type(m).__name__ for m in net.features] == ["Conv2d", "ReLU", "MaxPool2d"] * 3
    assert (net.fc.in_features, net.fc.out_features, net.head.out_features) == (64 * 4 * 4, 128, 10)
    x = torch.rand(5, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(cnn(x), cnn.net((x - 0.5) / 0.5))  # [0, 1] in, the digits' 0.5 / 0.5 inside
    assert cnn.info["input_size"] == [3, 32, 32] and cnn.info["arch"] == "cnn_digits_32"
    assert cnn.info["load_problems"] == []
    assert cnn.info["checkpoint_sha256"] == read_manifest()["cnn_at_digits"]["sha256"]


def test_what_the_cnn_cannot_be_is_refused() -> None:
    with pytest.raises(UserError, match="model 'cnn_at' has no architecture for 'imagenet' datasets"):
        resolve_model("cnn_at", "imagenet")
    with pytest.raises(ValueError, match="img_size 36 does not halve 3 times"):
        SmallCNN(img_size=36)
    with pytest.raises(UserError, match=r"no architecture argument\(s\) 'depth'; valid --model-arg names: channels, "
                                        r"hidden, img_size, in_chans"):
        rbp.load_model("cnn_at", depth=2)
    assert SmallCNN(img_size=64, channels=(8, 8))(torch.rand(1, 3, 64, 64)).shape == (1, 10)


def test_the_shipped_cnn_at_resists_pgd20_at_its_training_eps_and_far_less_above_it(cnn, digits) -> None:
    """Trained with PGD at the recipe's eps (six times the DeiT pair's 8/255), it keeps clean top-1 above 95% and
    PGD-20 there leaves over a third of the 360 test digits robust; at 4/3 of it, under a sixth."""
    entry = read_manifest()["cnn_at_digits"]
    recipe = alias_recipe("cnn_at")
    assert entry["recipe"] == recipe.as_dict() and entry["recipe_is_pinned"] and entry["family"] == "cnn_at"
    eps = recipe.adversarial.eps
    assert eps == pytest.approx(48 / 255) == 6 * Adversarial().eps
    x, y = digits
    with torch.no_grad():
        clean = (cnn(x).argmax(1) == y).double().mean().item()
    assert clean == pytest.approx(entry["clean_test_top1"], abs=1e-6) and clean > 0.95
    at_eps = _pgd20_robust(cnn, x, y, eps).double().mean().item()
    above = _pgd20_robust(cnn, x, y, eps * 4 / 3).double().mean().item()
    assert 1 / 3 < at_eps < clean - 0.3, at_eps  # robust to a share, and well below clean: the eps is large
    assert above < 1 / 6 and above < at_eps / 2, above


@pytest.mark.parametrize("eps", ["48/255", "64/255"])
def test_the_grid_cells_of_cnn_at_hold_autoattack_and_the_reference_on_all_360_digits(eps, cnn, digits) -> None:
    """The grid lists both cells; each holds AutoAttack (standard) on the 360 test digits with the shipped file, at
    or below PGD-20's robust accuracy, and the reference: AutoAttack's verdict per sample, then the extra attacks
    only on the samples AutoAttack left robust, never robust where AutoAttack broke it."""
    doc = _converge_doc()
    assert eps in doc.GRID["cnn_at"]
    cell = doc.cell_dir(doc.OUT, "cnn_at", eps)
    aa = rbp.load_records(cell / "autoattack")
    a = aa[aa["attack"] == "autoattack"]
    assert len(a) == 360 and a["sample_id"].is_unique
    assert (a["checkpoint_sha256"] == read_manifest()["cnn_at_digits"]["sha256"]).all()
    assert np.allclose(a["eps"].astype(float), parse_eps(eps))
    ref = pd.read_csv(cell / "reference.csv", dtype={"sample_id": str}).set_index("sample_id")
    aa_ok = a.set_index(a["sample_id"].astype(str))["correct_top1"].astype(bool)
    assert len(ref) == 360 and set(ref.index) == set(aa_ok.index)
    assert (ref["aa_correct"].astype(bool) == aa_ok.loc[ref.index]).all()
    assert (ref["reference_correct"].astype(bool) <= ref["aa_correct"].astype(bool)).all()
    robust = ref["aa_correct"].astype(bool)
    assert (ref.loc[~robust, "extra_forward"] == 0).all() and (ref.loc[robust, "extra_forward"] > 0).all()
    x, y = digits
    pgd = _pgd20_robust(cnn, x, y, parse_eps(eps)).double().mean().item()
    assert aa_ok.mean() <= pgd, (aa_ok.mean(), pgd)


def test_stepped_relus_round_the_output_to_1_over_steps_and_pass_relus_gradient_straight_through() -> None:
    """The held-out set's model with misleading gradients: the forward pass is a staircase (ReLU rounded to
    multiples of 1/steps), the input gradient autograd returns is plain ReLU's, and steps=0 is the plain CNN."""
    from robustbench_pid.models.cnn import SteppedReLU

    act = SteppedReLU(2)
    x = torch.tensor([-1.0, 0.2, 0.3, 0.74, 0.76, 1.1], requires_grad=True)
    y = act(x)
    assert y.tolist() == [0.0, 0.0, 0.5, 0.5, 1.0, 1.0]
    y.sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]  # ReLU's: the staircase itself is flat almost everywhere
    torch.manual_seed(0)
    plain = SmallCNN(channels=(4, 4), hidden=8, img_size=8)
    torch.manual_seed(0)
    stepped = SmallCNN(channels=(4, 4), hidden=8, img_size=8, steps=2)
    assert plain.state_dict().keys() == stepped.state_dict().keys()  # same weights, only the activation differs
    stepped.load_state_dict(plain.state_dict())
    img = torch.rand(3, 3, 8, 8)
    assert not torch.equal(plain(img), stepped(img))
    again = SmallCNN(channels=(4, 4), hidden=8, img_size=8, steps=0)
    again.load_state_dict(plain.state_dict())
    assert torch.equal(plain(img), again(img)) and isinstance(again.act, nn.ReLU)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="steps"):
            SmallCNN(steps=bad)
    with pytest.raises(ValueError, match="positive integer"):
        SteppedReLU(0)
    with pytest.raises(UserError, match=r"bad architecture argument\(s\) steps=-1: .* whole number >= 0"):
        rbp.load_model("cnn_at", steps=-1)  # the user's --model-arg reaches it as a clear error
