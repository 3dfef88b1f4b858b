"""PID attention against a direct, loop-based implementation of PIDformer Definition 1."""
from __future__ import annotations

import math
import threading

import pytest
import timm
import torch

import robustbench_pid  # noqa: F401  (registers the models)
from robustbench_pid.models.pid_vit import PidGains, PidVisionTransformer

SMALL = dict(img_size=16, patch_size=4, embed_dim=24, depth=3, num_heads=3, num_classes=5, mlp_ratio=2.0)


def _random_pid(gains: PidGains, seed: int = 0) -> PidVisionTransformer:
    torch.manual_seed(seed)
    m = PidVisionTransformer(gains=gains, **SMALL).eval()
    with torch.no_grad():  # make biases and norms non-trivial too
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m


def reference_features(m: PidVisionTransformer, x: torch.Tensor, g: PidGains) -> torch.Tensor:
    """Definition 1 written out token by token, head by head, layer by layer."""
    h = m._pos_embed(m.patch_embed(x))
    v0 = None
    err_sum = None
    err_prev = None
    for blk in m.blocks:
        a = blk.attn
        z = blk.norm1(h)
        B, N, C = z.shape
        H, d = a.num_heads, a.head_dim
        qkv = z @ a.qkv.weight.T + a.qkv.bias
        q, k, v = (qkv[..., i * C:(i + 1) * C].reshape(B, N, H, d) for i in range(3))
        if v0 is None:
            v0 = v.clone()
        e = g.beta * v0 - v
        err_sum = e.clone() if err_sum is None else err_sum + e
        d_term = e if err_prev is None else e - err_prev  # e^0 = 0 at the first layer
        err_prev = e
        u = torch.zeros_like(v)
        for b in range(B):
            for head in range(H):
                for i in range(N):
                    scores = torch.stack([q[b, i, head] @ k[b, j, head] / math.sqrt(d) for j in range(N)])
                    w = torch.softmax(scores, 0)
                    acc = sum(w[j] * v[b, j, head] for j in range(N))
                    u[b, i, head] = (acc + g.lambda_p * e[b, i, head] + g.lambda_i * err_sum[b, i, head]
                                     + g.lambda_d * d_term[b, i, head])
        out = u.reshape(B, N, C) @ a.proj.weight.T + a.proj.bias
        h = h + out
        h = h + blk.mlp(blk.norm2(h))
    return m.norm(h)


@pytest.mark.parametrize("gains", [PidGains(), PidGains(0.3, 0.2, 0.7, 0.9)])
def test_pid_matches_loop_reference(gains: PidGains) -> None:
    m = _random_pid(gains)
    x = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        ours = m.forward_features(x)
        ref = reference_features(m, x, gains)
    assert ours.shape == (2, 17, 24)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)
    # and the PID terms matter: the softmax model on the same weights differs
    soft = timm.models.vision_transformer.VisionTransformer(**SMALL).eval()
    soft.load_state_dict(m.state_dict())
    with torch.no_grad():
        assert (soft.forward_features(x) - ours).abs().max() > 1e-2


def test_first_derivative_none_drops_layer1_d_term() -> None:
    g_zero = PidGains(0.0, 0.0, 1.0, 0.5, first_derivative="zero-error")
    g_none = PidGains(0.0, 0.0, 1.0, 0.5, first_derivative="none")
    m1, m2 = _random_pid(g_zero), _random_pid(g_none)
    x = torch.rand(1, 3, 16, 16)
    with torch.no_grad():
        assert not torch.allclose(m1(x), m2(x))
    with pytest.raises(ValueError, match="first_derivative"):
        PidGains(first_derivative="bogus")


def test_zero_gains_equal_softmax_exactly() -> None:
    m = _random_pid(PidGains(0.0, 0.0, 0.0, 0.37))
    soft = timm.models.vision_transformer.VisionTransformer(**SMALL).eval()
    soft.load_state_dict(m.state_dict())
    x = torch.rand(4, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(m(x), soft(x))


def test_state_does_not_leak_across_batches_or_threads() -> None:
    m = _random_pid(PidGains())
    xa, xb = torch.rand(3, 3, 16, 16), torch.rand(5, 3, 16, 16)
    with torch.no_grad():
        ya, yb = m(xa), m(xb)
        # same result when called again, in another order, or per sample
        torch.testing.assert_close(m(xb), yb, rtol=0, atol=0)
        torch.testing.assert_close(m(xa), ya, rtol=0, atol=0)
        per_sample = torch.cat([m(xa[i:i + 1]) for i in range(3)])
        torch.testing.assert_close(per_sample, ya, rtol=1e-5, atol=1e-6)
    results = {}

    def work(name: str, x: torch.Tensor) -> None:
        with torch.no_grad():
            for _ in range(5):
                results.setdefault(name, []).append(m(x))

    threads = [threading.Thread(target=work, args=("a", xa)), threading.Thread(target=work, args=("b", xb))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for y in results["a"]:
        torch.testing.assert_close(y, ya, rtol=1e-5, atol=1e-6)
    for y in results["b"]:
        torch.testing.assert_close(y, yb, rtol=1e-5, atol=1e-6)


def test_registered_with_timm_and_deit_weights_fit() -> None:
    for name in ("pid_deit_tiny_patch16_224", "pid_deit_digits_patch4_32", "deit_digits_patch4_32"):
        assert timm.is_model(name)
    pid = timm.create_model("pid_deit_tiny_patch16_224")
    deit = timm.create_model("deit_tiny_patch16_224")
    assert pid.state_dict().keys() == deit.state_dict().keys()
    assert isinstance(pid, PidVisionTransformer)
    assert pid.gains == PidGains(0.8, 0.5, 0.05, 0.1)
    custom = timm.create_model("pid_deit_digits_patch4_32", lambda_p=0.1, beta=1.0)
    assert custom.gains.lambda_p == 0.1 and custom.gains.beta == 1.0 and custom.gains.lambda_i == 0.5
    assert all(b.attn.gains is custom.gains for b in custom.blocks)
    assert pid.pretrained_cfg["crop_pct"] == 0.875 and pid.pretrained_cfg["interpolation"] == "bicubic"


def test_softmax_part_uses_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.nn.functional as F

    calls = []
    real = F.scaled_dot_product_attention

    def spy(*a, **k):
        calls.append(a[0].shape)
        return real(*a, **k)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    m = _random_pid(PidGains())
    with torch.no_grad():
        m(torch.rand(1, 3, 16, 16))
    assert len(calls) == SMALL["depth"]
