"""DeiT + FeatScale and PID DeiT + FeatScale (PIDformer Table 6): parameter names and counts, the
re-weighting against its formula, neutral scales = base model, checkpoints, `evaluate` end to end."""
from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch

import robustbench_pid  # noqa: F401  (registers the models)
from robustbench_pid.errors import CheckpointError
from robustbench_pid.loaders import load_weights
from robustbench_pid.models.pid_vit import PidState
from zoo_helpers import assert_same_tensors, evaluate_fgsm, randomized

DEIT_TINY = 5717416  # timm deit_tiny_patch16_224


def _count(arch: str) -> int:
    with torch.device("meta"):
        net = timm.create_model(arch)
    return sum(p.numel() for p in net.parameters())


def test_scales_are_per_block_per_channel_and_start_neutral() -> None:
    for arch in ("featscale_deit_tiny_patch16_224", "pid_featscale_deit_tiny_patch16_224"):
        assert _count(arch) == DEIT_TINY + 12 * 2 * 192  # lamb1 + lamb2 per block
        net = timm.create_model(arch)
        for blk in net.blocks:
            assert blk.lamb1.shape == blk.lamb2.shape == (192,)
            assert not blk.lamb1.any() and not blk.lamb2.any()
    assert type(timm.create_model("pid_featscale_deit_digits_patch4_32")).__name__ == "PidVisionTransformer"


@pytest.mark.parametrize("pid", [False, True])
def test_block_rescales_dc_and_high_frequency_of_the_attention_output(pid: bool) -> None:
    net = randomized("pid_featscale_deit_digits_patch4_32" if pid else "featscale_deit_digits_patch4_32", 1).double()
    blk = net.blocks[0]
    x = torch.randn(2, 65, 64, dtype=torch.float64)
    with torch.no_grad():
        kw = (lambda: {"state": PidState()}) if pid else dict  # a fresh controller per pass
        a = blk.attn(blk.norm1(x), **kw())
        dc = a.mean(dim=1, keepdim=True)
        h = x + a + blk.lamb1 * dc + blk.lamb2 * (a - dc)
        ref = h + blk.mlp(blk.norm2(h))
        got = blk(x, **kw())
    assert torch.allclose(got, ref, atol=1e-12)
    assert not torch.allclose(got, x + a + blk.mlp(blk.norm2(x + a)), atol=1e-6)  # the scales matter here


@pytest.mark.parametrize("fs_arch,base_arch", [("featscale_deit_digits_patch4_32", "deit_digits_patch4_32"),
                                               ("pid_featscale_deit_digits_patch4_32", "pid_deit_digits_patch4_32")])
def test_neutral_scales_equal_the_base_model(fs_arch: str, base_arch: str) -> None:
    fs = randomized(fs_arch, 2)
    with torch.no_grad():
        for blk in fs.blocks:
            blk.lamb1.zero_()
            blk.lamb2.zero_()
    base = timm.create_model(base_arch).eval()
    base.load_state_dict({k: v for k, v in fs.state_dict().items() if "lamb" not in k})
    x = torch.rand(3, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(fs(x), base(x))


def test_featscale_checkpoint_loads_exactly_and_a_plain_deit_one_is_refused(tmp_path: Path) -> None:
    src = randomized("featscale_deit_tiny_patch16_224", 3)
    path = tmp_path / "featscale_tiny.pth"
    torch.save({"model": src.state_dict(), "epoch": 299}, path)  # the DeiT training scripts' layout
    for arch in ("featscale_deit_tiny_patch16_224", "pid_featscale_deit_tiny_patch16_224"):
        dst = timm.create_model(arch).eval()
        info = load_weights(dst, str(path))
        assert info["load_problems"] == [] and info["checkpoint_format"] == "model"
        assert_same_tensors(src, dst)
    deit = tmp_path / "deit.pth"
    torch.save({"model": randomized("deit_digits_patch4_32", 4).state_dict()}, deit)
    with pytest.raises(CheckpointError) as e:
        load_weights(timm.create_model("featscale_deit_digits_patch4_32"), str(deit))
    assert "no FeatScale scales" in str(e.value) and "--model deit or pid_deit" in str(e.value)
    assert "missing keys (8): blocks.0.lamb1, blocks.0.lamb2, blocks.1.lamb1" in str(e.value)
    fs = tmp_path / "fs.pth"
    torch.save({"model": randomized("featscale_deit_digits_patch4_32", 5).state_dict()}, fs)
    with pytest.raises(CheckpointError, match="trained with FeatScale.*--model featscale_deit or pid_featscale_deit"):
        load_weights(timm.create_model("pid_deit_digits_patch4_32"), str(fs))


@pytest.mark.parametrize("alias,arch", [("featscale_deit", "featscale_deit_digits_patch4_32"),
                                        ("pid_featscale_deit", "pid_featscale_deit_digits_patch4_32")])
def test_evaluate_fgsm_end_to_end(alias: str, arch: str, tmp_path: Path) -> None:
    _, _, info = evaluate_fgsm(alias, arch, tmp_path)
    assert info["checkpoint_load_problems"] == []
    assert ("pid" in info["arch_kwargs"]) == alias.startswith("pid_")
