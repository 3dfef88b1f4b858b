"""SymViT and RPC-SymViT (Teo & Nguyen, "Unveiling the hidden structure of self-attention via kernel
PCA", NeurIPS 2024), registered with timm.

SymViT is the RPC authors' softmax baseline: symmetric attention. One projection ``qkv`` of shape
(2*dim, dim) gives ``k`` (rows 0..dim) then ``v`` (rows dim..2*dim); each head computes
``softmax(k k^T / sqrt(d)) v`` (through ``F.scaled_dot_product_attention(k, k, v)``). Every other
parameter has timm ``VisionTransformer`` names, so the authors' checkpoints
(``blocks.i.attn.qkv.weight`` of shape (2*dim, dim)) load as they are.

RPC-SymViT replaces the attention of the chosen layers by ``pap_iterations`` steps of Principal
Attention Pursuit (the paper's Algorithm 1), per head, with key matrix K (N x d):

    S_{k+1} = shrink_tau(K - L_k + Y_k / mu)
    L_{k+1} = softmax(K' K'^T / sqrt(d)) V,   K' = K - S_{k+1} - Y_k / mu
    Y_{k+1} = Y_k + mu (K - L_{k+1} - S_{k+1})

from S_0 = Y_0 = L_0 = 0, output L_n. With zero iterations the layer is plain SymViT attention.
mu = N*D / (4 ||K||_1) with ||K||_1 the entrywise L1 norm of the head's key matrix. Two readings
of the constants exist and both are offered (``pap_convention``):

* ``"authors"`` (default; what the authors' released code trains and evaluates, so their checkpoints
  reproduce): D is the model width (all heads, e.g. 192 for tiny) and the shrinkage threshold is
  ``tau = lambda * mu``.
* ``"paper"``: D is the head width (the key matrix of one head is N x d) and ``tau = lambda / mu``
  as written in Algorithm 1 (S_{lambda/mu}).

Unlike the authors' version (which allocates its state with ``.to("cuda")``) everything here is
created with the input's device and dtype, so it runs on CPU and GPU alike.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from timm.layers import Attention
from timm.models import generate_default_cfgs, register_model
from timm.models._builder import build_model_with_cfg
from timm.models.vision_transformer import VisionTransformer
from timm.models.vision_transformer import checkpoint_filter_fn as _vit_filter
from torch import nn

from .configs import DIGITS_CFG, IMAGENET_CFG

CONVENTIONS = ("authors", "paper")


@dataclass(frozen=True)
class RpcConfig:
    """PAP settings of an RPC-SymViT. Defaults: the paper's best tiny model (6 iterations, layer 1, lambda 4)."""

    pap_iterations: int = 0  # 0 = plain symmetric attention (SymViT)
    pap_lambda: float = 4.0  # sparsity weight lambda (paper: 4 for first-layer models, 3 for all-layer)
    rpc_layers: str = "first"  # "first", "all", or comma-separated 0-based block indices ("0,1,2")
    pap_convention: str = "authors"  # "authors" (released code) or "paper" (Algorithm 1 as printed)

    def __post_init__(self) -> None:
        if int(self.pap_iterations) != self.pap_iterations or self.pap_iterations < 0:
            raise ValueError(f"pap_iterations must be a whole number >= 0, got {self.pap_iterations!r}")
        object.__setattr__(self, "pap_iterations", int(self.pap_iterations))  # 2.0 from JSON counts as 2
        if not self.pap_lambda > 0:
            raise ValueError(f"pap_lambda must be > 0, got {self.pap_lambda!r}")
        if self.pap_convention not in CONVENTIONS:
            raise ValueError(f"pap_convention must be one of {CONVENTIONS}, got {self.pap_convention!r}")
        self.layer_indices(10 ** 6)  # validates rpc_layers

    def layer_indices(self, depth: int) -> List[int]:
        spec = str(self.rpc_layers).strip().lower()
        if spec == "first":
            return [0]
        if spec == "all":
            return list(range(depth))
        try:
            idx = sorted({int(t) for t in spec.split(",") if t.strip()})
        except ValueError:
            raise ValueError(f"rpc_layers must be 'first', 'all' or comma-separated block indices, "
                             f"got {self.rpc_layers!r}") from None
        bad = [i for i in idx if not 0 <= i < depth]
        if bad or not idx:
            raise ValueError(f"rpc_layers {self.rpc_layers!r}: block indices must lie in 0..{depth - 1}")
        return idx

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def soft_threshold(x: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """Elementwise shrinkage sgn(x) max(|x| - tau, 0)."""
    return x.sign() * (x.abs() - tau).clamp_min(0)


def pap_attention(k: torch.Tensor, v: torch.Tensor, iterations: int, lam: float, *,
                  convention: str = "authors", model_dim: Optional[int] = None,
                  dropout_p: float = 0.0, q: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Principal Attention Pursuit on (B, H, N, d) keys/values; returns L_n (B, H, N, d).

    ``model_dim`` (all heads' width) is D in mu under the ``authors`` convention. With ``q`` (asymmetric
    attention, RPC paper E.10) each step attends ``softmax(q K'^T / sqrt(d)) V`` instead of
    ``softmax(K' K'^T / sqrt(d)) V``: PAP still cleans the keys only.
    """
    if iterations <= 0:
        return F.scaled_dot_product_attention(k if q is None else q, k, v, dropout_p=dropout_p)
    n_tok, d = k.shape[-2], k.shape[-1]
    width = (model_dim or d * k.shape[1]) if convention == "authors" else d
    l1 = k.abs().sum(dim=(-2, -1), keepdim=True).clamp_min(torch.finfo(k.dtype).tiny)
    mu = n_tok * width / (4.0 * l1)
    tau = lam * mu if convention == "authors" else lam / mu
    low = torch.zeros_like(k)
    y = torch.zeros_like(k)
    for it in range(iterations):
        s = soft_threshold(k - low + y / mu, tau)
        kc = k - s - y / mu
        low = F.scaled_dot_product_attention(kc if q is None else q, kc, v,
                                             dropout_p=dropout_p if it == iterations - 1 else 0.0)
        if it < iterations - 1:
            y = y + mu * (k - low - s)
    return low


class SymAttention(Attention):
    """Symmetric attention: ``qkv`` is Linear(dim, 2*dim) giving k then v; softmax(k k^T/sqrt(d)) v.

    ``pap_iterations > 0`` turns the layer into RPC-Attention (set per block by the model).
    """

    def __init__(self, dim: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(dim, *args, **kwargs)
        if getattr(self, "gate", None) is not None:
            raise ValueError("SymAttention does not support gated attention")
        self.qkv = nn.Linear(dim, self.attn_dim * 2, bias=self.qkv.bias is not None)
        self.q_norm = nn.Identity()  # there is no query
        self.pap_iterations = 0
        self.pap_lambda = 4.0
        self.pap_convention = "authors"

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, **_: Any) -> torch.Tensor:  # type: ignore[override]
        if attn_mask is not None:
            raise NotImplementedError("SymAttention takes no attention mask")
        B, N, _ = x.shape
        kv = self.qkv(x).reshape(B, N, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        k, v = kv.unbind(0)
        k = self.k_norm(k)
        p = self.attn_drop.p if self.training else 0.0
        out = pap_attention(k, v, self.pap_iterations, self.pap_lambda, convention=self.pap_convention,
                            model_dim=self.attn_dim, dropout_p=p)
        out = out.transpose(1, 2).reshape(B, N, self.attn_dim)
        out = self.norm(out)
        out = self.proj(out)
        return self.proj_drop(out)


class SymVisionTransformer(VisionTransformer):
    """timm ``VisionTransformer`` with symmetric attention; RPC-Attention in ``rpc.rpc_layers``."""

    # arguments the model factory turns into ``rpc`` (RPC_FIELDS below)
    factory_kwargs = ("pap_iterations", "pap_lambda", "rpc_layers", "pap_convention")

    def __init__(self, *args: Any, rpc: Optional[RpcConfig] = None, **kwargs: Any) -> None:
        kwargs["attn_layer"] = SymAttention
        super().__init__(*args, **kwargs)
        self.rpc = rpc or RpcConfig()
        assign_pap([blk.attn for blk in self.blocks], self.rpc)


def assign_pap(attns: Sequence[nn.Module], rpc: RpcConfig) -> None:
    """Give the attention layers ``rpc.rpc_layers`` their PAP iterations (0 elsewhere), lambda and convention."""
    rpc_blocks = set(rpc.layer_indices(len(attns))) if rpc.pap_iterations else set()
    for i, attn in enumerate(attns):
        attn.pap_iterations = rpc.pap_iterations if i in rpc_blocks else 0
        attn.pap_lambda = float(rpc.pap_lambda)
        attn.pap_convention = rpc.pap_convention


def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: nn.Module, **kwargs: Any) -> Dict[str, torch.Tensor]:
    """timm's ViT filter (position-embedding resampling etc.); the k/v layout needs no conversion."""
    return _vit_filter(state_dict, model, **kwargs)


RPC_FIELDS = ("pap_iterations", "pap_lambda", "rpc_layers", "pap_convention")


def rpc_from_kwargs(kwargs: Dict[str, Any], defaults: Optional[Dict[str, Any]] = None) -> RpcConfig:
    """Pop ``rpc=`` or the PAP settings given as model keywords into an ``RpcConfig`` over ``defaults``."""
    given = {k: kwargs.pop(k) for k in RPC_FIELDS if k in kwargs}
    return kwargs.pop("rpc", None) or RpcConfig(**{**(defaults or {}), **given})


def _create(variant: str, pretrained: bool = False, rpc_defaults: Optional[Dict[str, Any]] = None,
            **kwargs: Any) -> SymVisionTransformer:
    rpc = rpc_from_kwargs(kwargs, rpc_defaults)
    return build_model_with_cfg(
        SymVisionTransformer, variant, pretrained,
        pretrained_filter_fn=partial(checkpoint_filter_fn, adapt_layer_scale=True),
        feature_cfg=dict(out_indices=3, feature_cls="getter"),
        rpc=rpc, **kwargs,
    )


_SIZES = {
    "tiny": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),
    "small": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "base": dict(patch_size=16, embed_dim=768, depth=12, num_heads=12),
}
# Same size as the embedded digits DeiT (32x32 input, patch 4, 4 blocks, width 64), for CPU work.
_DIGITS = dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0, num_classes=10)
# RPC defaults per size: the paper's tiny models use 6 iterations at layer 1 with lambda 4 (its best
# clean/robust tiny variant); its base model uses 2 iterations in all layers (lambda 3 for all-layer).
_RPC_TINY = dict(pap_iterations=6, pap_lambda=4.0, rpc_layers="first")
_RPC_BASE = dict(pap_iterations=2, pap_lambda=3.0, rpc_layers="all")

default_cfgs = generate_default_cfgs({
    **{f"symvit_{s}_patch16_224": IMAGENET_CFG for s in _SIZES},
    **{f"rpc_symvit_{s}_patch16_224": IMAGENET_CFG for s in _SIZES},
    "symvit_digits_patch4_32": DIGITS_CFG,
    "rpc_symvit_digits_patch4_32": DIGITS_CFG,
})


@register_model
def symvit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> SymVisionTransformer:
    """SymViT-tiny (the RPC paper's baseline): symmetric softmax attention, 12 x 192, 3 heads."""
    return _create("symvit_tiny_patch16_224", pretrained, **dict(_SIZES["tiny"], **kwargs))


@register_model
def symvit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> SymVisionTransformer:
    """SymViT-small: symmetric softmax attention, 12 x 384, 6 heads."""
    return _create("symvit_small_patch16_224", pretrained, **dict(_SIZES["small"], **kwargs))


@register_model
def symvit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> SymVisionTransformer:
    """SymViT-base: symmetric softmax attention, 12 x 768, 12 heads."""
    return _create("symvit_base_patch16_224", pretrained, **dict(_SIZES["base"], **kwargs))


@register_model
def rpc_symvit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> SymVisionTransformer:
    """RPC-SymViT-tiny: PAP (6 iterations, lambda 4) in the first layer by default."""
    return _create("rpc_symvit_tiny_patch16_224", pretrained, _RPC_TINY, **dict(_SIZES["tiny"], **kwargs))


@register_model
def rpc_symvit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> SymVisionTransformer:
    """RPC-SymViT-small: PAP (6 iterations, lambda 4) in the first layer by default."""
    return _create("rpc_symvit_small_patch16_224", pretrained, _RPC_TINY, **dict(_SIZES["small"], **kwargs))


@register_model
def rpc_symvit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> SymVisionTransformer:
    """RPC-SymViT-base: PAP (2 iterations, lambda 3) in all layers by default (the paper's base model)."""
    return _create("rpc_symvit_base_patch16_224", pretrained, _RPC_BASE, **dict(_SIZES["base"], **kwargs))


@register_model
def symvit_digits_patch4_32(pretrained: bool = False, **kwargs: Any) -> SymVisionTransformer:
    """SymViT at the embedded digits size (32x32, patch 4, 4 blocks, width 64)."""
    return _create("symvit_digits_patch4_32", pretrained, **dict(_DIGITS, **kwargs))


@register_model
def rpc_symvit_digits_patch4_32(pretrained: bool = False, **kwargs: Any) -> SymVisionTransformer:
    """RPC-SymViT at the digits size: PAP (6 iterations, lambda 4) in the first layer by default."""
    return _create("rpc_symvit_digits_patch4_32", pretrained, _RPC_TINY, **dict(_DIGITS, **kwargs))


# --- zoo aliases -------------------------------------------------------------------------------
from .zoo import ModelEntry, zoo  # noqa: E402  (after the timm registrations above)

zoo.add("symvit", ModelEntry(
    "symvit", "SymViT: symmetric softmax attention, the RPC paper's baseline",
    archs={"digits": "symvit_digits_patch4_32", "imagenet": "symvit_tiny_patch16_224"},
    default_checkpoints={"digits": "embedded:symvit_digits"},
    crop_pct={"imagenet": 0.875},
))
zoo.add("rpc_symvit", ModelEntry(
    "rpc_symvit", "RPC-SymViT (6 iter/layer1): PAP, 6 iterations, lambda 4, first layer",
    archs={"digits": "rpc_symvit_digits_patch4_32", "imagenet": "rpc_symvit_tiny_patch16_224"},
    default_checkpoints={"digits": "embedded:rpc_symvit_digits"},
    arch_kwargs=dict(_RPC_TINY, pap_convention="authors"),
    crop_pct={"imagenet": 0.875},
))
zoo.add("rpc_symvit_all", ModelEntry(
    "rpc_symvit_all", "RPC-SymViT (2 iter/all-layer): PAP, 2 iterations, lambda 3, every layer",
    archs={"digits": "rpc_symvit_digits_patch4_32", "imagenet": "rpc_symvit_tiny_patch16_224"},
    default_checkpoints={"digits": "embedded:rpc_symvit_all_digits"},
    arch_kwargs=dict(_RPC_BASE, pap_convention="authors"),
    crop_pct={"imagenet": 0.875},
))
