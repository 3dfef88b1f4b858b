"""SymViT and RPC-SymViT against direct, loop-based implementations of the RPC paper."""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Dict

import pytest
import timm
import torch

import robustbench_pid  # noqa: F401  (registers the models)
from robustbench_pid.errors import CheckpointError, UserError
from robustbench_pid.loaders import load_weights
from robustbench_pid.models.symvit import RpcConfig, SymVisionTransformer, pap_attention

SMALL = dict(img_size=16, patch_size=4, embed_dim=24, depth=3, num_heads=3, num_classes=5, mlp_ratio=2.0)


def _sym(seed: int = 0, **rpc) -> SymVisionTransformer:
    torch.manual_seed(seed)
    m = SymVisionTransformer(rpc=RpcConfig(**rpc), **SMALL).eval()
    with torch.no_grad():  # non-trivial biases and norms
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m


def ref_symmetric(attn, z: torch.Tensor) -> torch.Tensor:
    """softmax(k k^T / sqrt(d)) v per head; qkv rows [0, C) are k, [C, 2C) are v."""
    B, N, C = z.shape
    H, d = attn.num_heads, attn.head_dim
    kv = z @ attn.qkv.weight.T + attn.qkv.bias
    k, v = kv[..., :C], kv[..., C:]
    out = torch.zeros(B, N, C, dtype=z.dtype)
    for b in range(B):
        for h in range(H):
            kh, vh = k[b, :, h * d:(h + 1) * d], v[b, :, h * d:(h + 1) * d]
            a = torch.softmax(kh @ kh.T / math.sqrt(d), dim=-1)
            out[b, :, h * d:(h + 1) * d] = a @ vh
    return out @ attn.proj.weight.T + attn.proj.bias


def ref_pap_head(K: torch.Tensor, V: torch.Tensor, n: int, lam: float, convention: str, model_dim: int) -> torch.Tensor:
    """Algorithm 1 for one head, one image, written out with explicit matrices."""
    N, d = K.shape
    D = model_dim if convention == "authors" else d
    mu = N * D / (4 * K.abs().sum())
    tau = lam * mu if convention == "authors" else lam / mu
    L = torch.zeros_like(K)
    S = torch.zeros_like(K)
    Y = torch.zeros_like(K)
    for _ in range(n):
        M = K - L + Y / mu
        S = torch.where(M > tau, M - tau, torch.where(M < -tau, M + tau, torch.zeros_like(M)))
        Kc = K - S - Y / mu
        L = torch.softmax(Kc @ Kc.T / math.sqrt(d), dim=-1) @ V
        Y = Y + mu * (K - L - S)
    return L


def test_symmetric_attention_matches_reference_and_layout() -> None:
    m = _sym()
    assert m.blocks[0].attn.qkv.weight.shape == (48, 24)  # (2*dim, dim): k then v
    z = torch.randn(2, 17, 24, dtype=torch.float64)
    attn = m.blocks[1].attn.double()
    with torch.no_grad():
        assert torch.allclose(attn(z), ref_symmetric(attn, z), atol=1e-10)


def test_symmetric_attention_uses_sdpa_with_k_as_query(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.nn.functional as F

    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, *a, **kw):
        seen.append(q is k)
        return real(q, k, v, *a, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    m = _sym()
    with torch.no_grad():
        m(torch.rand(1, 3, 16, 16))
    assert seen == [True] * 3


@pytest.mark.parametrize("layers", ["first", "all", "0,2"])
def test_rpc_with_zero_iterations_equals_symvit(layers: str) -> None:
    sym = _sym(0)
    rpc = _sym(1, pap_iterations=0, rpc_layers=layers, pap_lambda=3.0)
    rpc.load_state_dict(sym.state_dict())
    x = torch.rand(3, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(sym(x), rpc(x))


@pytest.mark.parametrize("convention", ["authors", "paper"])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_pap_matches_algorithm_1(convention: str, n: int) -> None:
    torch.manual_seed(n)
    B, H, N, d = 2, 3, 9, 4
    k = torch.randn(B, H, N, d, dtype=torch.float64)
    v = torch.randn(B, H, N, d, dtype=torch.float64)
    lam = 0.5 if convention == "authors" else 0.3  # thresholds that zero some entries and keep others
    out = pap_attention(k, v, n, lam, convention=convention, model_dim=H * d)
    for b in range(B):
        for h in range(H):
            ref = ref_pap_head(k[b, h], v[b, h], n, lam, convention, H * d)
            assert torch.allclose(out[b, h], ref, atol=1e-10)
    plain = pap_attention(k, v, 0, lam)
    assert not torch.allclose(out, plain, atol=1e-4)  # the iterations do change the output


def test_pap_shrinkage_is_active_in_the_test_above() -> None:
    """Guard against a vacuous Algorithm-1 test: S_1 has zero and non-zero entries."""
    torch.manual_seed(1)
    K = torch.randn(9, 4, dtype=torch.float64)
    for conv, lam, D in (("authors", 0.5, 12), ("paper", 0.3, 4)):
        mu = 9 * D / (4 * K.abs().sum())
        tau = lam * mu if conv == "authors" else lam / mu
        frac = (K.abs() > tau).double().mean().item()
        assert 0.05 < frac < 0.95, (conv, frac)


def test_rpc_layers_first_all_and_explicit() -> None:
    assert [b.attn.pap_iterations for b in _sym(pap_iterations=3).blocks] == [3, 0, 0]
    assert [b.attn.pap_iterations for b in _sym(pap_iterations=2, rpc_layers="all").blocks] == [2, 2, 2]
    assert [b.attn.pap_iterations for b in _sym(pap_iterations=2, rpc_layers="1,2").blocks] == [0, 2, 2]
    with pytest.raises(ValueError, match="block indices must lie in 0..2"):
        _sym(pap_iterations=2, rpc_layers="5")
    with pytest.raises(ValueError, match="pap_convention"):
        RpcConfig(pap_convention="cuda")


def test_rpc_model_first_layer_matches_reference_block() -> None:
    """The whole RPC-SymViT: block 1 runs PAP, the later blocks plain symmetric attention."""
    m = _sym(2, pap_iterations=3, pap_lambda=0.5).double()
    x = torch.rand(2, 3, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        h = m._pos_embed(m.patch_embed(x))
        for i, blk in enumerate(m.blocks):
            z = blk.norm1(h)
            if i == 0:
                a = blk.attn
                B, N, C = z.shape
                kv = z @ a.qkv.weight.T + a.qkv.bias
                out = torch.zeros(B, N, C, dtype=z.dtype)
                for b in range(B):
                    for hd in range(a.num_heads):
                        sl = slice(hd * a.head_dim, (hd + 1) * a.head_dim)
                        out[b, :, sl] = ref_pap_head(kv[b, :, :C][:, sl], kv[b, :, C:][:, sl], 3, 0.5, "authors", C)
                att = out @ a.proj.weight.T + a.proj.bias
            else:
                att = ref_symmetric(blk.attn, z)
            h = h + att
            h = h + blk.mlp(blk.norm2(h))
        ref = m.head(m.norm(h)[:, 0])
        assert torch.allclose(m(x), ref, atol=1e-9)


def authors_layout_state_dict(dim: int, depth: int, heads: int, img: int, patch: int, classes: int,
                              mlp_ratio: float = 4.0) -> Dict[str, torch.Tensor]:
    """The key set and shapes of the RPC authors' training checkpoints, written out by hand."""
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return 0.02 * torch.randn(*shape, generator=g)

    n_tok = (img // patch) ** 2 + 1
    hid = int(dim * mlp_ratio)
    sd = {"cls_token": r(1, 1, dim), "pos_embed": r(1, n_tok, dim),
          "patch_embed.proj.weight": r(dim, 3, patch, patch), "patch_embed.proj.bias": r(dim),
          "norm.weight": 1 + r(dim), "norm.bias": r(dim), "head.weight": r(classes, dim), "head.bias": r(classes)}
    for i in range(depth):
        p = f"blocks.{i}."
        sd.update({p + "norm1.weight": 1 + r(dim), p + "norm1.bias": r(dim),
                   p + "attn.qkv.weight": r(2 * dim, dim), p + "attn.qkv.bias": r(2 * dim),
                   p + "attn.proj.weight": r(dim, dim), p + "attn.proj.bias": r(dim),
                   p + "norm2.weight": 1 + r(dim), p + "norm2.bias": r(dim),
                   p + "mlp.fc1.weight": r(hid, dim), p + "mlp.fc1.bias": r(hid),
                   p + "mlp.fc2.weight": r(dim, hid), p + "mlp.fc2.bias": r(dim)})
    return sd


def test_authors_layout_checkpoint_loads_into_symvit_tiny(tmp_path: Path) -> None:
    sd = authors_layout_state_dict(192, 12, 3, 224, 16, 1000)
    path = tmp_path / "checkpoint.pth"
    torch.save({"model": sd, "epoch": 299, "model_ema": sd,
                "args": argparse.Namespace(model="deit_tiny_patch16_224", robust=True, n=6, lambd=4, layer=0)}, path)
    with pytest.raises(CheckpointError, match="argparse.Namespace"):
        load_weights(timm.create_model("symvit_tiny_patch16_224"), str(path))
    for arch in ("symvit_tiny_patch16_224", "rpc_symvit_tiny_patch16_224"):
        net = timm.create_model(arch)
        info = load_weights(net, str(path), allow_pickle=True)
        assert info["load_problems"] == [] and info["loaded_keys"] == len(sd)
        assert torch.equal(net.blocks[7].attn.qkv.weight, sd["blocks.7.attn.qkv.weight"])
    with pytest.raises(CheckpointError, match="symmetric attention"):
        load_weights(timm.create_model("deit_tiny_patch16_224"), str(path), allow_pickle=True)


def test_zoo_aliases_need_a_checkpoint_on_imagenet_and_record_pap_settings(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from robustbench_pid import load_model

    with pytest.raises(UserError, match="needs weights: pass --checkpoint"):
        load_model("rpc_symvit", dataset="imagenet")
    assert load_model("rpc_symvit").info["checkpoint"].endswith("rpc_symvit_digits.safetensors")  # embedded default
    sd = authors_layout_state_dict(64, 4, 4, 32, 4, 10, mlp_ratio=2.0)
    save_file(sd, str(tmp_path / "sym.safetensors"))
    sym = load_model("symvit", str(tmp_path / "sym.safetensors"))
    rpc = load_model("rpc_symvit", str(tmp_path / "sym.safetensors"))
    rpc0 = load_model("rpc_symvit", str(tmp_path / "sym.safetensors"), pap_iterations=0)
    pap = {"pap_iterations": 6, "pap_lambda": 4.0, "rpc_layers": "first", "pap_convention": "authors"}
    # the alias's arguments, plus the settings the built model actually carries
    assert rpc.info["arch_kwargs"] == {**pap, "rpc": pap}
    assert load_model("rpc_symvit_digits_patch4_32", str(tmp_path / "sym.safetensors")).info["arch_kwargs"]["rpc"][
        "pap_iterations"] > 0
    assert [b.attn.pap_iterations for b in rpc.net.blocks] == [6, 0, 0, 0]
    x = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(sym(x), rpc0(x))
        assert not torch.allclose(sym(x), rpc(x))


def test_pid_zero_gains_through_the_zoo_equals_softmax_deit() -> None:
    """PID DeiT with lP = lI = lD = beta = 0 is softmax DeiT: same checkpoint, same logits."""
    from robustbench_pid import load_model

    deit = load_model("deit")
    # softmax DeiT's weights in the PID architecture: not what they were made for, so only a non-strict load
    pid0 = load_model("pid_deit", "embedded:deit_digits", lambda_p=0.0, lambda_i=0.0, lambda_d=0.0, beta=0.0,
                      strict=False)
    assert "made for architecture deit_digits_patch4_32" in pid0.info["load_problems"][0]
    x = torch.rand(8, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(deit(x), pid0(x), atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CPU path tested above)")
def test_rpc_runs_on_gpu_and_matches_cpu() -> None:
    m = _sym(3, pap_iterations=4, rpc_layers="all", pap_lambda=0.5)
    x = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        cpu = m(x)
        gpu = m.cuda()(x.cuda()).cpu()
    assert torch.allclose(cpu, gpu, atol=1e-4)


def test_pap_state_follows_the_input_device_and_dtype() -> None:
    """No device is hard-coded (the authors' version allocates on "cuda"): run on the meta device and in bf16."""
    k = torch.randn(1, 2, 5, 4, device="meta")
    out = pap_attention(k, k.clone(), 3, 4.0)
    assert out.device.type == "meta" and out.shape == (1, 2, 5, 4)
    kb = torch.randn(1, 2, 5, 4, dtype=torch.bfloat16)
    assert pap_attention(kb, kb.clone(), 2, 4.0).dtype == torch.bfloat16
