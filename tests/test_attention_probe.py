"""The attention probe (issue 27): metrics against hand values, the readers against the models' own forward."""
from __future__ import annotations

import math

import pytest
import timm
import torch
import torch.nn.functional as F
from torch import nn

import robustbench_pid  # noqa: F401  (registers the zoo's timm models)
from robustbench_pid.errors import UserError
from robustbench_pid.models.pid_vit import PidState
from robustbench_pid.models.symvit import pap_attention
from robustbench_pid.probes.attention import layer_metrics, pap_sparse, pid_terms, qkv_of, rows
from robustbench_pid.probes.metrics import (attention_entropy, attention_probs, effective_rank, representation_shift,
                                            token_similarity)

torch.manual_seed(0)


# --- the metrics on tiny tensors -------------------------------------------------------------
def test_effective_rank_of_rank_one_is_one_and_of_orthogonal_is_its_size() -> None:
    u, v = torch.randn(6, 1), torch.randn(1, 4)
    assert effective_rank((u @ v)[None]).item() == pytest.approx(1.0, abs=1e-6)
    q, _ = torch.linalg.qr(torch.randn(5, 5, dtype=torch.float64))
    assert effective_rank(q[None]).item() == pytest.approx(5.0, abs=1e-9)
    assert effective_rank(torch.eye(3)[None] * 7).item() == pytest.approx(3.0, abs=1e-9)  # scale-free
    # singular values (2, 1, 1): p = (1/2, 1/4, 1/4), H = 1.5 log 2, erank = 2^1.5
    assert effective_rank(torch.diag(torch.tensor([2.0, 1.0, 1.0]))[None]).item() == pytest.approx(2 ** 1.5, abs=1e-9)
    assert math.isnan(effective_rank(torch.zeros(1, 3, 3)).item())  # undefined, never 0


def test_entropy_of_uniform_attention_is_log_n_and_of_one_hot_is_zero() -> None:
    n = 7
    uniform = torch.full((2, 3, n, n), 1.0 / n)
    assert torch.allclose(attention_entropy(uniform), torch.full((2,), math.log(n), dtype=torch.float64))
    one_hot = torch.eye(n).expand(1, 2, n, n)
    assert attention_entropy(one_hot).item() == pytest.approx(0.0, abs=1e-12)
    # equal logits give uniform probabilities
    q = torch.zeros(1, 1, n, 4)
    assert attention_entropy(attention_probs(q, torch.randn(1, 1, n, 4), 0.5)).item() == pytest.approx(math.log(n))


def test_shift_is_zero_for_the_clean_input_and_relative_otherwise() -> None:
    h = torch.randn(3, 5, 4)
    assert torch.equal(representation_shift(h, h), torch.zeros(3, dtype=torch.float64))
    assert torch.allclose(representation_shift(2 * h, h), torch.ones(3, dtype=torch.float64))
    d = torch.zeros_like(h)
    d[:, 0, 0] = 3.0
    want = 3.0 / h.double().flatten(1).norm(dim=1)
    assert torch.allclose(representation_shift(h + d, h), want)
    assert math.isnan(representation_shift(torch.ones(1, 2, 2), torch.zeros(1, 2, 2)).item())


def test_token_similarity_is_the_a6_metric() -> None:
    t = torch.randn(1, 4)
    assert token_similarity(t.expand(6, 4)[None]).item() == pytest.approx(1.0, abs=1e-9)
    assert token_similarity(torch.eye(5)[None]).item() == pytest.approx(0.0, abs=1e-12)


# --- the readers reproduce each attention's own computation ----------------------------------
def _merge(attn: nn.Module, out: torch.Tensor) -> torch.Tensor:
    B, H, N, d = out.shape
    return attn.proj(attn.norm(out.transpose(1, 2).reshape(B, N, H * d))) if hasattr(attn, "norm") else \
        attn.proj(out.transpose(1, 2).reshape(B, N, H * d))


@pytest.mark.parametrize("arch", ["deit_digits_patch4_32", "symvit_digits_patch4_32", "rpc_deit_digits_patch4_32",
                                  "fan_digits_patch4_32"])
def test_reader_probabilities_reproduce_the_module_output(arch: str) -> None:
    """softmax(q k^T scale) v from the reader, merged as the module merges, equals the module's own output
    (fused SDPA inside): the probabilities the entropy is computed from are the ones the model uses."""
    m = timm.create_model(arch).eval()
    attn = m.blocks[1].attn  # layer 2: no PAP in the RPC models (PAP is in the first layer)
    x = torch.randn(2, 17, m.embed_dim)
    (q, k, v, scale), why = qkv_of(attn, x)
    assert why == ""
    with torch.no_grad():
        got = _merge(attn, attention_probs(q, k, scale) @ v.float())
        assert torch.allclose(got, attn(x), atol=1e-5)


def test_pap_sparse_matches_pap_attention() -> None:
    k, v, q = torch.randn(2, 3, 9, 4), torch.randn(2, 3, 9, 4), torch.randn(2, 3, 9, 4)
    for conv in ("authors", "paper"):
        for qq in (None, q):
            low, s, _ = pap_sparse(k, v, 3, 2.0, conv, 12, q=qq)
            assert torch.allclose(low, pap_attention(k, v, 3, 2.0, convention=conv, model_dim=12, q=qq), atol=1e-6)
            assert s.abs().sum() > 0  # the shrinkage removed something at lambda 2


def test_pid_terms_add_up_to_the_controlled_output() -> None:
    """The terms the shares are computed from, summed and merged as PidAttention merges them, give the
    module's own output, at the first layer and at a later one (state carried from the first)."""
    m = timm.create_model("pid_deit_digits_patch4_32").eval()
    x = torch.randn(2, 17, m.embed_dim)
    state = PidState()
    with torch.no_grad():
        for blk in m.blocks[:2]:
            attn = blk.attn
            (q, k, v, scale), _ = qkv_of(attn, x)
            terms = pid_terms(attn, state, attention_probs(q, k, scale), v)
            want = _merge(attn, terms["attn"] + terms["p"] + terms["i"] + terms["d"])
            assert torch.allclose(attn(x, state=state), want, atol=1e-5)
            x = x + 0.1 * torch.randn_like(x)
    # layer 1 of a whole model: e^1 = beta v^0 - v^1 = (beta - 1) v^1, so ||e^1|| = (1 - beta) ||v^1||
    img = torch.rand(3, 3, 32, 32)
    _, values, absent = layer_metrics(m, img)
    assert absent == {}
    for layer in range(1, 5):
        shares = sum(values[(layer, f"pid_share_{t}")] for t in ("attn", "p", "i", "d"))
        assert torch.allclose(shares, torch.ones(3, dtype=torch.float64))
    blk = m.blocks[0]
    with torch.no_grad():
        tok = m.norm_pre(m.patch_drop(m._pos_embed(m.patch_embed(img))))
        (_, _, v, _), _ = qkv_of(blk.attn, blk.norm1(tok))
    want = (1 - blk.attn.gains.beta) * v.double().flatten(1).norm(dim=1)
    assert torch.allclose(values[(1, "pid_error_norm")], want, rtol=1e-5)


def test_pid_internals_only_for_pid_models_and_pap_only_on_pap_layers() -> None:
    x = torch.rand(2, 3, 32, 32)
    for arch, pid in (("pid_deit_digits_patch4_32", True), ("deit_digits_patch4_32", False),
                      ("pid_fan_digits_patch4_32", True), ("fan_digits_patch4_32", False)):
        _, values, _ = layer_metrics(timm.create_model(arch).eval(), x)
        names = {m for _, m in values}
        assert ("pid_error_norm" in names) is pid, arch
        assert {"shift", "token_similarity", "effective_rank", "attention_entropy"} <= names
    # the printed convention (tau = lambda / mu) shrinks a random-init model's small keys; the authors' removes nothing
    _, values, _ = layer_metrics(timm.create_model("rpc_symvit_digits_patch4_32", pap_convention="paper").eval(), x)
    assert {layer for layer, m in values if m == "pap_sparse_norm"} == {1}  # PAP runs in the first layer only
    assert (values[(1, "pap_sparse_fraction")] > 0).all() and (values[(1, "pap_sparse_fraction")] < 1).all()
    assert not any(m.startswith("pid_") for _, m in values)


def test_random_init_timm_vit_goes_through_the_generic_path() -> None:
    m = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, num_classes=10,
                          depth=3).eval()
    x, x_adv = torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32)
    reps, clean, absent = layer_metrics(m, x)
    assert absent == {} and sorted(reps) == [0, 1, 2, 3]
    n_tokens = 1 + (32 // 8) ** 2
    for layer in range(1, 4):
        h = clean[(layer, "attention_entropy")]
        assert ((h > 0) & (h <= math.log(n_tokens) + 1e-9)).all()
        assert torch.equal(clean[(layer, "shift")], torch.zeros(2, dtype=torch.float64))
    _, adv, _ = layer_metrics(m, x_adv, reps)
    assert (adv[(0, "shift")] > 0).all()
    df = rows(["a", "b"], adv, {})
    assert set(df.columns) == {"sample_id", "layer", "metric", "value", "moved", "note"}
    assert len(df) == 2 * len(adv)


class _OddAttention(nn.Module):
    def forward(self, x: torch.Tensor, **_: object) -> torch.Tensor:
        return x * 0.5


def test_unreadable_attention_is_absent_with_a_reason_never_zero() -> None:
    m = timm.create_model("deit_digits_patch4_32").eval()
    m.blocks[2].attn = _OddAttention()
    _, values, absent = layer_metrics(m, torch.rand(2, 3, 32, 32))
    assert (3, "attention_entropy") not in values
    assert "_OddAttention exposes no q/k projection" in absent[(3, "attention_entropy")]
    df = rows(["a", "b"], values, absent)
    gone = df[(df["layer"] == 3) & (df["metric"] == "attention_entropy")]
    assert gone["value"].isna().all() and gone["note"].str.contains("no q/k").all()


def test_a_model_without_blocks_is_a_clear_error() -> None:
    with pytest.raises(UserError, match="has no `.blocks`"):
        layer_metrics(nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10)), torch.rand(1, 3, 32, 32))


@pytest.mark.parametrize("arch", ["rpc_symvit_digits_patch4_32", "rpc_deit_digits_patch4_32"])
def test_pap_layer_entropy_reads_the_attention_of_the_last_pap_step(arch: str) -> None:
    m = timm.create_model(arch, pap_convention="paper").eval()
    attn = m.blocks[0].attn
    x = torch.randn(2, 17, m.embed_dim)
    (q, k, v, scale), _ = qkv_of(attn, x)
    sym = q is k
    _, s, kc = pap_sparse(k, v, attn.pap_iterations, attn.pap_lambda, attn.pap_convention, attn.attn_dim,
                          q=None if sym else q)
    with torch.no_grad():
        got = _merge(attn, attention_probs(kc if sym else q, kc, scale) @ v)
        assert torch.allclose(got, attn(x), atol=1e-5)
    assert s.abs().sum() > 0
