"""FeatScale's ``featscale_add``: "once" (the paper, our default) and "twice" (the authors' current DeiT block)
differ on identical weights by exactly the scaled DC + high-frequency term, block by block; it is recorded."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import pytest
import timm
import torch
from safetensors.torch import save_file

import robustbench_pid  # noqa: F401  (registers the models)
from robustbench_pid.errors import UserError
from robustbench_pid.models import load_model
from zoo_helpers import randomized

ARCHS = ["featscale_deit_digits_patch4_32", "pid_featscale_deit_digits_patch4_32"]


def _run(net: torch.nn.Module, x: torch.Tensor) -> Dict[str, List[torch.Tensor]]:
    """Logits plus, per block: its input, its attention output ``a`` and the residual after attention ``h``
    (the input of ``norm2``)."""
    seen: Dict[str, List[torch.Tensor]] = {"x": [], "a": [], "h": []}
    hooks = []
    for blk in net.blocks:
        hooks.append(blk.register_forward_pre_hook(lambda m, args: seen["x"].append(args[0])))
        hooks.append(blk.attn.register_forward_hook(lambda m, args, out: seen["a"].append(out)))
        hooks.append(blk.norm2.register_forward_pre_hook(lambda m, args: seen["h"].append(args[0])))
    with torch.no_grad():
        seen["logits"] = [net(x)]
    for h in hooks:
        h.remove()
    return seen


def _term(blk: torch.nn.Module, a: torch.Tensor) -> torch.Tensor:
    """The scaled parts FeatScale adds: lamb1 * DC(a) + lamb2 * HF(a), DC the mean over tokens."""
    dc = a.mean(dim=1, keepdim=True)
    return blk.lamb1 * dc + blk.lamb2 * (a - dc)


@pytest.mark.parametrize("arch", ARCHS)
def test_twice_differs_from_once_by_exactly_the_scaled_term(arch: str) -> None:
    once = randomized(arch, 5).double()
    twice = timm.create_model(arch, featscale_add="twice").eval().double()
    twice.load_state_dict(once.state_dict())
    assert all(b.featscale_add == "twice" for b in twice.blocks) and once.blocks[0].featscale_add == "once"
    x = torch.rand(2, 3, 32, 32, dtype=torch.float64)
    r1, r2 = _run(once, x), _run(twice, x)
    # block 0 sees the same input in both models: the residuals after attention differ by the term
    assert torch.equal(r1["x"][0], r2["x"][0]) and torch.allclose(r1["a"][0], r2["a"][0], atol=1e-13)
    term = _term(once.blocks[0], r1["a"][0])
    assert term.abs().max() > 1e-3  # the scales are not zero, so the term is there
    assert torch.allclose(r2["h"][0] - r1["h"][0], term, atol=1e-12)
    # every block of each model: h = x + a + term (once) or x + a + 2 * term (twice)
    for run, k, net in ((r1, 1, once), (r2, 2, twice)):
        for i, blk in enumerate(net.blocks):
            got = run["h"][i] - run["x"][i] - run["a"][i]
            assert torch.allclose(got, k * _term(blk, run["a"][i]), atol=1e-12), (k, i)
    # and the whole model's logits differ
    assert (r1["logits"][0] - r2["logits"][0]).abs().max() > 1e-4


@pytest.mark.parametrize("arch", ARCHS)
def test_with_zero_scales_the_two_agree(arch: str) -> None:
    once = randomized(arch, 6)
    with torch.no_grad():
        for blk in once.blocks:
            blk.lamb1.zero_()
            blk.lamb2.zero_()
    twice = timm.create_model(arch, featscale_add="twice").eval()
    twice.load_state_dict(once.state_dict())
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(once(x), twice(x))


def test_the_choice_is_recorded_and_checked(tmp_path: Path) -> None:
    ck = tmp_path / "fs.safetensors"
    save_file(randomized("featscale_deit_digits_patch4_32", 7).state_dict(), str(ck))
    default = load_model("featscale_deit", str(ck), dataset="digits")
    assert default.info["arch_kwargs"]["featscale"] == {"featscale_add": "once"}
    twice = load_model("featscale_deit", str(ck), dataset="digits", featscale_add="twice")
    assert twice.info["arch_kwargs"]["featscale"] == {"featscale_add": "twice"}
    assert twice.info["arch_kwargs"]["featscale_add"] == "twice"
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert not torch.allclose(default(x), twice(x), atol=1e-5)
    with pytest.raises(UserError, match="featscale_add must be one of 'once', 'twice'"):
        load_model("featscale_deit", str(ck), dataset="digits", featscale_add="thrice")
    with pytest.raises(UserError, match="no architecture argument"):
        load_model("deit", None, dataset="digits", featscale_add="twice")  # not a FeatScale model
