"""FAN-ViT, PID-FAN, symmetric FAN and RPC-FAN: sizes against the published figures, the blocks against
written-out formulas, release checkpoint formats, the zero-setting equalities, and `evaluate` end to end."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import timm
import torch
import torch.nn.functional as F

import robustbench_pid  # noqa: F401  (registers the models)
from robustbench_pid.errors import CheckpointError
from robustbench_pid.loaders import load_weights
from robustbench_pid.models.pid_vit import PidGains, PidState
from robustbench_pid.models.symvit import pap_attention
from zoo_helpers import RELEASE_FORMATS, assert_same_tensors, evaluate_fgsm, randomized

# NVlabs/FAN README: FAN-T/S/B/L-ViT have 7.3M / 28.0M / 54.0M / 80.5M parameters.
PUBLISHED_M = {"fan_tiny_12_p16_224": 7.3, "fan_small_12_p16_224": 28.0,
               "fan_base_18_p16_224": 54.0, "fan_large_24_p16_224": 80.5}
SIZES = {"fan_tiny_12_p16_224": (192, 12, 4), "fan_small_12_p16_224": (384, 12, 8),
         "fan_base_18_p16_224": (448, 18, 8), "fan_large_24_p16_224": (480, 24, 10)}


def fan_param_count(C: int, depth: int, heads: int, classes: int = 1000, r: int = 4, symmetric: bool = False) -> int:
    """FAN-ViT's parameter count from its layout, term by term (patch 16 conv stem, 2 class-attention blocks)."""
    lin = lambda i, o: i * o + o  # noqa: E731
    stem = 0
    chans = [3, C // 8, C // 4, C // 2, C]
    for a, b in zip(chans, chans[1:]):
        stem += 9 * a * b + 2 * b  # 3x3 conv without bias + BatchNorm affine
    pos = lin(64, C)  # 1x1 conv from the 2 x 32 Fourier features
    H = r * C
    attn = (0 if symmetric else lin(C, C)) + lin(C, 2 * C) + lin(C, C)
    mlp = heads + lin(C, C) + lin(C, H) + 2 * (9 * H + H) + 2 * H + H + lin(H, C) + 2 * C
    block = 2 * C + attn + 2 * C + mlp + 2 * C
    cls_block = 2 * C + 4 * lin(C, C) + 2 * C + 2 * C + lin(C, H) + lin(H, C)
    return stem + pos + depth * block + C + 2 * cls_block + 2 * C + lin(C, classes)


def _count(arch: str) -> int:
    with torch.device("meta"):
        net = timm.create_model(arch)
    return sum(p.numel() for p in net.parameters())


@pytest.mark.parametrize("arch", sorted(PUBLISHED_M))
def test_fan_sizes_match_layout_and_published_counts(arch: str) -> None:
    n = _count(arch)
    assert n == fan_param_count(*SIZES[arch])
    assert abs(n / 1e6 - PUBLISHED_M[arch]) / PUBLISHED_M[arch] < 0.015  # 7.32M, 28.35M, 54.35M, 80.57M
    pid = _count("pid_" + arch)
    assert pid == n  # the PID controller adds no parameters


def test_symmetric_fan_tiny_drops_the_query_projection() -> None:
    n = _count("symfan_tiny_12_p16_224")
    assert n == fan_param_count(192, 12, 4, symmetric=True) == _count("fan_tiny_12_p16_224") - 12 * (192 * 192 + 192)
    assert _count("rpc_fan_tiny_12_p16_224") == n


def test_fan_tiny_forward_and_release_key_layout() -> None:
    torch.manual_seed(0)
    net = timm.create_model("fan_tiny_12_p16_224").eval()
    with torch.no_grad():
        out = net(torch.rand(1, 3, 224, 224))
    assert out.shape == (1, 1000) and torch.isfinite(out).all()
    keys = set(net.state_dict())
    for k in ("patch_embed.proj.0.0.weight", "patch_embed.proj.0.1.running_var", "patch_embed.proj.6.0.weight",
              "pos_embed.token_projection.weight", "blocks.11.attn.q.weight", "blocks.11.attn.kv.weight",
              "blocks.0.attn.proj.bias", "blocks.0.mlp.q.weight", "blocks.0.mlp.temperature",
              "blocks.0.mlp.mlp_v.fc1.weight", "blocks.0.mlp.mlp_v.dwconv.conv1.weight",
              "blocks.0.mlp.mlp_v.dwconv.bn.running_mean", "blocks.0.mlp.mlp_v.gamma", "blocks.0.mlp.norm_v.weight",
              "blocks.0.gamma1", "blocks.0.gamma2", "cls_token", "cls_attn_blocks.1.attn.k.weight",
              "cls_attn_blocks.0.gamma2", "cls_attn_blocks.0.mlp.fc2.weight", "norm.weight", "head.weight"):
        assert k in keys, k
    cfg = net.pretrained_cfg
    assert (cfg["input_size"], cfg["crop_pct"], cfg["interpolation"]) == ((3, 224, 224), 1.0, "bicubic")
    assert cfg["mean"] == (0.485, 0.456, 0.406) and cfg["std"] == (0.229, 0.224, 0.225)


def ref_channel_processing(m, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """FAN's channel processing written out: value MLP with conv branch, LayerNorm, per-head channel gates."""
    B, N, C = x.shape
    mv = m.mlp_v
    h = x @ mv.fc1.weight.T + mv.fc1.bias
    g = h.transpose(1, 2).reshape(B, -1, H, W)
    dw = mv.dwconv
    g = F.conv2d(g, dw.conv1.weight, dw.conv1.bias, padding=1, groups=g.shape[1])
    g = F.gelu(g)
    g = (g - dw.bn.running_mean[:, None, None]) / torch.sqrt(dw.bn.running_var[:, None, None] + dw.bn.eps)
    g = g * dw.bn.weight[:, None, None] + dw.bn.bias[:, None, None]
    g = F.conv2d(g, dw.conv2.weight, dw.conv2.bias, padding=1, groups=g.shape[1])
    h = h + mv.gamma * g.reshape(B, -1, N).transpose(1, 2)
    v = F.layer_norm(h @ mv.fc2.weight.T + mv.fc2.bias, (C,), m.norm_v.weight, m.norm_v.bias, 1e-5)
    q = x @ m.q.weight.T + m.q.bias
    d = C // m.num_heads
    out = torch.empty_like(v)
    for b in range(B):
        for hd in range(m.num_heads):
            sl = slice(hd * d, (hd + 1) * d)
            qs = torch.softmax(q[b, :, sl], dim=0)  # over tokens
            kbar = torch.softmax(x[b, :, sl], dim=0).mean(dim=1)  # (N,)
            gate = torch.sigmoid(qs.T @ kbar) * m.temperature[hd, 0, 0]
            out[b, :, sl] = v[b, :, sl] * gate
    return out


def ref_token_mixing(a, x: torch.Tensor, sym: bool = False) -> torch.Tensor:
    B, N, C = x.shape
    d = C // a.num_heads
    kv = x @ a.kv.weight.T + a.kv.bias
    k, v = kv[..., :C], kv[..., C:]
    q = k if sym else x @ a.q.weight.T + a.q.bias
    out = torch.empty(B, N, C, dtype=x.dtype)
    for b in range(B):
        for hd in range(a.num_heads):
            sl = slice(hd * d, (hd + 1) * d)
            out[b, :, sl] = torch.softmax(q[b, :, sl] @ k[b, :, sl].T / math.sqrt(d), -1) @ v[b, :, sl]
    return out @ a.proj.weight.T + a.proj.bias


def test_fan_block_parts_match_written_out_formulas() -> None:
    net = randomized("fan_digits_patch4_32", 1).double()
    blk = net.blocks[2]
    x = torch.randn(2, 64, 64, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(blk.mlp(x, 8, 8), ref_channel_processing(blk.mlp, x, 8, 8), atol=1e-10)
        assert torch.allclose(blk.attn(x), ref_token_mixing(blk.attn, x), atol=1e-10)
        sym = randomized("symfan_digits_patch4_32", 2).double().blocks[1].attn
        assert not hasattr(sym, "q") and sym.kv.weight.shape == (128, 64)
        assert torch.allclose(sym(x), ref_token_mixing(sym, x, sym=True), atol=1e-10)


def test_pid_fan_first_layer_adds_the_controller_terms() -> None:
    """Layer 1: e = (beta - 1) v, so u = softmax(q k^T) v + (lP + lI + lD) (beta - 1) v before proj."""
    net = randomized("pid_fan_digits_patch4_32", 3).double()
    a = net.blocks[0].attn
    x = torch.randn(2, 64, 64, dtype=torch.float64)
    g = PidGains()
    C = 64
    v = x @ a.kv.weight[C:].T + a.kv.bias[C:]
    extra = (g.lambda_p + g.lambda_i + g.lambda_d) * (g.beta - 1.0) * v
    with torch.no_grad():
        got = a(x, state=PidState())
        assert torch.allclose(got, ref_token_mixing(a, x) + extra @ a.proj.weight.T, atol=1e-10)
        with pytest.raises(RuntimeError, match="controller state"):
            a(x)


def test_pid_fan_with_zero_gains_equals_fan_and_default_gains_differ() -> None:
    fan = randomized("fan_digits_patch4_32", 4)
    pid0 = timm.create_model("pid_fan_digits_patch4_32", lambda_p=0.0, lambda_i=0.0, lambda_d=0.0, beta=0.0).eval()
    pid = timm.create_model("pid_fan_digits_patch4_32").eval()
    pid0.load_state_dict(fan.state_dict())
    pid.load_state_dict(fan.state_dict())
    x = torch.rand(3, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(fan(x), pid0(x))
        assert not torch.allclose(fan(x), pid(x), atol=1e-4)
    assert pid.gains == PidGains() and pid0.gains.lambda_p == 0.0


def test_rpc_fan_zero_iterations_equals_symmetric_fan_and_layer_one_runs_pap() -> None:
    sym = randomized("symfan_digits_patch4_32", 5)
    rpc = timm.create_model("rpc_fan_digits_patch4_32").eval()
    rpc0 = timm.create_model("rpc_fan_digits_patch4_32", pap_iterations=0).eval()
    for m in (rpc, rpc0):
        m.load_state_dict(sym.state_dict())
    assert [b.attn.pap_iterations for b in rpc.blocks] == [4, 0, 0, 0]
    assert rpc.rpc.pap_lambda == 4.0 and rpc.rpc.rpc_layers == "first"
    x = torch.rand(3, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(sym(x), rpc0(x))
        assert not torch.allclose(sym(x), rpc(x), atol=1e-5)
        # layer 1 is PAP (4 iterations, lambda 4, mu = N D / (4 ||K||_1)) on FAN's k and v
        a = rpc.blocks[0].attn
        z = torch.randn(2, 64, 64)
        k, v = (t.reshape(2, 64, 4, 16).transpose(1, 2) for t in a.kv(z).chunk(2, dim=-1))
        ref = pap_attention(k, v, 4, 4.0, convention="authors", model_dim=64)
        ref = a.proj(ref.transpose(1, 2).reshape(2, 64, 64))
        assert torch.allclose(a(z), ref, atol=1e-6)


@pytest.mark.parametrize("fmt", sorted(RELEASE_FORMATS))
def test_release_formats_load_exactly(fmt: str, tmp_path: Path) -> None:
    wrap, expected = RELEASE_FORMATS[fmt]
    src = randomized("fan_digits_patch4_32", 6)
    path = tmp_path / "fan_vit_digits.pth.tar"  # the released FAN files are .pth.tar
    torch.save(wrap({k: v.clone() for k, v in src.state_dict().items()}), path)
    for arch in ("fan_digits_patch4_32", "pid_fan_digits_patch4_32"):
        dst = randomized(arch, 7)
        info = load_weights(dst, str(path))
        assert_same_tensors(src, dst)
        assert info["checkpoint_format"] == expected and info["load_problems"] == []
        assert info["loaded_keys"] == len(src.state_dict())
        if fmt == "module-prefix":
            assert "stripped 'module.' prefix" in info["checkpoint_adaptations"]


def test_fan_tiny_checkpoint_with_raw_and_ema_weights(tmp_path: Path) -> None:
    """timm training output: raw and EMA weights side by side; raw by default, EMA with #state_dict_ema."""
    raw, ema = randomized("fan_tiny_12_p16_224", 8), randomized("fan_tiny_12_p16_224", 9)
    path = tmp_path / "model_best.pth.tar"  # timm's train.py output name
    torch.save({"state_dict": raw.state_dict(), "state_dict_ema": ema.state_dict(), "epoch": 299}, path)
    dst = timm.create_model("fan_tiny_12_p16_224").eval()
    assert load_weights(dst, str(path))["checkpoint_format"] == "state_dict"
    assert_same_tensors(raw, dst)
    assert load_weights(dst, f"{path}#state_dict_ema")["checkpoint_format"] == "state_dict_ema"
    assert_same_tensors(ema, dst)


def test_mismatching_keys_are_named(tmp_path: Path) -> None:
    sd = randomized("fan_digits_patch4_32", 10).state_dict()
    sd.pop("blocks.1.mlp.temperature")
    sd["blocks.0.attn.qkv.weight"] = torch.zeros(192, 64)
    path = tmp_path / "broken.pth"
    torch.save({"state_dict": sd}, path)
    with pytest.raises(CheckpointError) as e:
        load_weights(timm.create_model("fan_digits_patch4_32"), str(path))
    msg = str(e.value)
    assert "missing keys (1): blocks.1.mlp.temperature" in msg
    assert "unexpected keys (1): blocks.0.attn.qkv.weight" in msg and "--non-strict" in msg
    # a standard FAN checkpoint does not fit symmetric FAN: every attn.q is named
    full = tmp_path / "fan.pth"
    torch.save({"model": randomized("fan_digits_patch4_32", 11).state_dict()}, full)
    with pytest.raises(CheckpointError) as e:
        load_weights(timm.create_model("rpc_fan_digits_patch4_32"), str(full))
    assert "standard FAN attention (attn.q and attn.kv); load it with --model fan or pid_fan" in str(e.value)
    assert "unexpected keys (8): blocks.0.attn.q.weight, blocks.0.attn.q.bias" in str(e.value)


@pytest.mark.parametrize("alias,arch", [("fan", "fan_digits_patch4_32"), ("pid_fan", "pid_fan_digits_patch4_32"),
                                        ("symfan", "symfan_digits_patch4_32"), ("rpc_fan", "rpc_fan_digits_patch4_32")])
def test_evaluate_fgsm_end_to_end(alias: str, arch: str, tmp_path: Path) -> None:
    _, _, info = evaluate_fgsm(alias, arch, tmp_path)
    assert info["checkpoint_load_problems"] == [] and info["checkpoint_strict"] is True
    if alias == "pid_fan":
        assert info["arch_kwargs"]["pid"]["lambda_p"] == 0.8
    if alias == "rpc_fan":
        assert info["arch_kwargs"]["rpc"] == {"pap_iterations": 4, "pap_lambda": 4.0, "rpc_layers": "first",
                                              "pap_convention": "authors"}


def test_models_command_lists_every_new_model(capsys: pytest.CaptureFixture) -> None:
    """`robustbench-pid models --json`: the aliases of issue 12 with their architectures, sizes and settings."""
    import json

    from robustbench_pid.cli import main

    assert main(["models", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    aliases = {a["name"]: a for a in info["aliases"]}
    archs = {a["arch"]: a for a in info["architectures"]}
    expected = {"fan": "fan_tiny_12_p16_224", "pid_fan": "pid_fan_tiny_12_p16_224", "symfan": "symfan_tiny_12_p16_224",
                "rpc_fan": "rpc_fan_tiny_12_p16_224", "featscale_deit": "featscale_deit_tiny_patch16_224",
                "pid_featscale_deit": "pid_featscale_deit_tiny_patch16_224", "rpc_deit": "rpc_deit_tiny_patch16_224",
                "rpc_symasym_deit": "rpc_symasym_deit_tiny_patch16_224"}
    for alias, arch in expected.items():
        assert aliases[alias]["families"]["imagenet"] == {"arch": arch, "checkpoint": None}
        assert aliases[alias]["families"]["digits"]["arch"] in archs
        assert arch in archs
    for arch in ("fan_small_12_p16_224", "fan_base_18_p16_224", "fan_large_24_p16_224", "pid_fan_large_24_p16_224",
                 "symvit_base_patch16_224", "rpc_symvit_base_patch16_224"):
        assert arch in archs
    tiny = archs["fan_tiny_12_p16_224"]
    assert (tiny["embed_dim"], tiny["depth"], tiny["num_heads"], tiny["patch_size"], tiny["params_m"]) == (
        192, 12, 4, [16, 16], 7.32)
    assert archs["pid_fan_tiny_12_p16_224"]["arguments"]["lambda_i"] == 0.5
    assert archs["rpc_fan_tiny_12_p16_224"]["arguments"] == {
        "pap_iterations": 4, "pap_lambda": 4.0, "rpc_layers": "first", "pap_convention": "authors"}
    assert archs["symfan_tiny_12_p16_224"]["arguments"]["pap_iterations"] == 0
