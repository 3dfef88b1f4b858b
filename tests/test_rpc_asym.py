"""RPC on asymmetric attention (RPC paper Table 14) and the base-size SymViT/RPC-SymViT (Tables 7-8):
PAP with a query against Algorithm 1 written out, zero iterations = DeiT, DeiT checkpoints, `evaluate`."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import timm
import torch

import robustbench_pid  # noqa: F401  (registers the models)
from robustbench_pid import load_model
from robustbench_pid.loaders import load_weights
from robustbench_pid.models.symvit import pap_attention
from zoo_helpers import assert_same_tensors, evaluate_fgsm, randomized


def ref_asym_pap_head(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, n: int, lam: float, D: int) -> torch.Tensor:
    """Algorithm 1 with Softmax(Q, K - S - Y/mu) in place of the symmetric kernel (E.10), one head."""
    N, d = K.shape
    mu = N * D / (4 * K.abs().sum())
    tau = lam * mu
    L = torch.zeros_like(K)
    Y = torch.zeros_like(K)
    for _ in range(n):
        M = K - L + Y / mu
        S = torch.sign(M) * torch.clamp(M.abs() - tau, min=0)
        Kc = K - S - Y / mu
        L = torch.softmax(Q @ Kc.T / math.sqrt(d), dim=-1) @ V
        Y = Y + mu * (K - L - S)
    return L


@pytest.mark.parametrize("n", [1, 4])
def test_pap_with_a_query_matches_the_written_out_algorithm(n: int) -> None:
    torch.manual_seed(n)
    B, H, N, d = 2, 3, 9, 4
    q, k, v = (torch.randn(B, H, N, d, dtype=torch.float64) for _ in range(3))
    out = pap_attention(k, v, n, 0.5, model_dim=H * d, q=q)
    for b in range(B):
        for h in range(H):
            assert torch.allclose(out[b, h], ref_asym_pap_head(q[b, h], k[b, h], v[b, h], n, 0.5, H * d), atol=1e-10)
    assert not torch.allclose(out, pap_attention(k, v, n, 0.5, model_dim=H * d), atol=1e-4)  # q is used
    plain = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), -1) @ v
    assert torch.allclose(pap_attention(k, v, 0, 0.5, q=q), plain, atol=1e-10)


def test_zero_iterations_is_deit_and_defaults_run_pap_in_layer_one() -> None:
    deit = load_model("deit")
    rpc0 = load_model("rpc_deit", "embedded:deit_digits", pap_iterations=0, strict=False)  # DeiT's weights
    rpc = load_model("rpc_deit", "embedded:deit_digits", strict=False)
    assert "made for architecture deit_digits_patch4_32" in rpc.info["load_problems"][0]
    assert [b.attn.pap_iterations for b in rpc.net.blocks] == [4, 0, 0, 0]
    assert rpc.info["arch_kwargs"]["rpc"] == {"pap_iterations": 4, "pap_lambda": 4.0, "rpc_layers": "first",
                                              "pap_convention": "authors"}
    x = torch.rand(8, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(deit(x), rpc0(x))
        assert not torch.allclose(deit(x), rpc(x), atol=1e-5)


def test_first_block_attention_is_key_side_pap() -> None:
    net = randomized("rpc_deit_digits_patch4_32", 1).double()
    a = net.blocks[0].attn
    x = torch.randn(2, 65, 64, dtype=torch.float64)
    q, k, v = (t.reshape(2, 65, 4, 16).transpose(1, 2) for t in a.qkv(x).chunk(3, dim=-1))
    ref = torch.empty(2, 4, 65, 16, dtype=torch.float64)
    for b in range(2):
        for h in range(4):
            ref[b, h] = ref_asym_pap_head(q[b, h], k[b, h], v[b, h], 4, 4.0, 64)
    ref = a.proj(ref.transpose(1, 2).reshape(2, 65, 64))
    with torch.no_grad():
        assert torch.allclose(a(x), ref, atol=1e-10)


def test_deit_release_checkpoint_loads_into_rpc_deit_tiny(tmp_path: Path) -> None:
    src = randomized("deit_tiny_patch16_224", 2)
    path = tmp_path / "deit_tiny_patch16_224-a1311bcf.pth"
    torch.save({"model": src.state_dict()}, path)
    dst = timm.create_model("rpc_deit_tiny_patch16_224").eval()
    info = load_weights(dst, str(path))
    assert info["load_problems"] == [] and info["loaded_keys"] == len(src.state_dict())
    assert_same_tensors(src, dst)
    with torch.device("meta"):
        n = sum(p.numel() for p in timm.create_model("rpc_deit_tiny_patch16_224").parameters())
    assert n == 5717416  # DeiT-tiny: PAP adds no parameters


def test_symvit_base_sizes_cover_tables_7_and_8() -> None:
    """SymViT-base / RPC-SymViT-base (2 iterations in all layers, lambda 3) are the registered base sizes."""
    with torch.device("meta"):
        sym = timm.create_model("symvit_base_patch16_224")
        rpc = timm.create_model("rpc_symvit_base_patch16_224")
        deit = timm.create_model("deit_base_patch16_224")
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(sym) == count(rpc) == count(deit) - 12 * (768 * 768 + 768)  # 86.57M minus the query
    assert (sym.embed_dim, len(sym.blocks), sym.blocks[0].attn.num_heads) == (768, 12, 12)
    assert [b.attn.pap_iterations for b in rpc.blocks] == [2] * 12 and rpc.rpc.pap_lambda == 3.0


def test_evaluate_fgsm_end_to_end(tmp_path: Path) -> None:
    _, _, info = evaluate_fgsm("rpc_deit", "rpc_deit_digits_patch4_32", tmp_path)
    assert info["checkpoint_load_problems"] == [] and info["arch_kwargs"]["rpc"]["pap_iterations"] == 4


def test_sym_asym_variant_has_a_symmetric_pap_first_layer() -> None:
    """Table 14 "Sym/Asym": layer 1 is symmetric attention (qkv of 2*dim rows) with PAP, the rest q/k/v."""
    with torch.device("meta"):
        tiny = timm.create_model("rpc_symasym_deit_tiny_patch16_224")
    assert sum(p.numel() for p in tiny.parameters()) == 5717416 - (192 * 192 + 192)
    net = randomized("rpc_symasym_deit_digits_patch4_32", 3).double()
    assert [tuple(b.attn.qkv.weight.shape) for b in net.blocks] == [(128, 64)] + [(192, 64)] * 3
    assert net.blocks[0].attn.pap_iterations == 4 and net.rpc.pap_lambda == 4.0
    a = net.blocks[0].attn
    x = torch.randn(2, 65, 64, dtype=torch.float64)
    k, v = (t.reshape(2, 65, 4, 16).transpose(1, 2) for t in a.qkv(x).chunk(2, dim=-1))
    with torch.no_grad():
        ref = a.proj(pap_attention(k, v, 4, 4.0, model_dim=64).transpose(1, 2).reshape(2, 65, 64))
        assert torch.allclose(a(x), ref, atol=1e-10)
        a.pap_iterations = 0
        plain = torch.softmax(k @ k.transpose(-1, -2) / 4.0, -1) @ v  # sqrt(16) = 4
        assert torch.allclose(a(x), a.proj(plain.transpose(1, 2).reshape(2, 65, 64)), atol=1e-10)


def test_evaluate_fgsm_end_to_end_sym_asym(tmp_path: Path) -> None:
    _, _, info = evaluate_fgsm("rpc_symasym_deit", "rpc_symasym_deit_digits_patch4_32", tmp_path)
    assert info["checkpoint_load_problems"] == [] and info["arch_kwargs"]["rpc"]["rpc_layers"] == "first"
