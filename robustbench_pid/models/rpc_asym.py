"""RPC-Attention on asymmetric attention: RPC-AsymViT (RPC paper, appendix E.10, Table 14).

"4iter/layer1" (``rpc_deit_*``): a standard q/k/v DeiT (timm ``VisionTransformer`` names, ``qkv`` of 3*dim rows, so DeiT checkpoints
load) whose chosen layers run Principal Attention Pursuit on the keys only: each PAP step attends
``softmax(Q (K - S - Y/mu)^T / sqrt(d)) V`` where SymViT's RPC attends with the cleaned keys on both
sides. PAP and its settings are SymViT's (``symvit.pap_attention`` with ``q=``, ``RpcConfig``);
defaults as in Table 14: 4 iterations in the first layer, lambda 4 (the paper's value for first-layer
models; Table 14 does not restate it), mu = N D / (4 ||K||_1). With zero iterations the model is
softmax DeiT exactly.

"Sym/Asym" (``rpc_symasym_deit_*``): the PAP layers use SymViT's symmetric attention (``SymAttention``:
``qkv`` of 2*dim rows, k then v, PAP on ``softmax(K' K'^T) V``), every other layer standard q/k/v
attention; so ``blocks.0.attn.qkv`` has 2*dim rows and the later ones 3*dim.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Dict, Optional

import torch
from timm.layers import Attention
from timm.models import generate_default_cfgs, register_model
from timm.models._builder import build_model_with_cfg
from timm.layers import trunc_normal_
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn

from .configs import DIGITS_CFG, IMAGENET_CFG
from .pid_vit import DIGITS_ARCH
from .symvit import RpcConfig, SymAttention, SymVisionTransformer, assign_pap, pap_attention, rpc_from_kwargs

__all__ = ["AsymRpcAttention", "RpcAsymVisionTransformer", "SymAsymVisionTransformer", "RPC_ASYM_DEFAULTS",
           "checkpoint_filter_fn"]

RPC_ASYM_DEFAULTS: Dict[str, Any] = dict(pap_iterations=4, pap_lambda=4.0, rpc_layers="first")


class AsymRpcAttention(Attention):
    """timm ``Attention`` (same parameters); ``pap_iterations > 0`` runs PAP on its keys."""

    def __init__(self, dim: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(dim, *args, **kwargs)
        if getattr(self, "gate", None) is not None:
            raise ValueError("AsymRpcAttention does not support gated attention")
        self.pap_iterations = 0
        self.pap_lambda = 4.0
        self.pap_convention = "authors"

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, **_: Any) -> torch.Tensor:  # type: ignore[override]
        if attn_mask is not None:
            raise NotImplementedError("AsymRpcAttention takes no attention mask")
        B, N, _ = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        p = self.attn_drop.p if self.training else 0.0
        out = pap_attention(k, v, self.pap_iterations, self.pap_lambda, convention=self.pap_convention,
                            model_dim=self.attn_dim, dropout_p=p, q=q)
        out = out.transpose(1, 2).reshape(B, N, self.attn_dim)
        return self.proj_drop(self.proj(self.norm(out)))


class RpcAsymVisionTransformer(VisionTransformer):
    """timm ``VisionTransformer`` with key-side PAP in ``rpc.rpc_layers``."""

    factory_kwargs = SymVisionTransformer.factory_kwargs  # the RPC settings its factory turns into ``rpc``

    def __init__(self, *args: Any, rpc: Optional[RpcConfig] = None, **kwargs: Any) -> None:
        kwargs["attn_layer"] = AsymRpcAttention
        super().__init__(*args, **kwargs)
        self.rpc = rpc or RpcConfig()
        assign_pap([blk.attn for blk in self.blocks], self.rpc)


class SymAsymVisionTransformer(VisionTransformer):
    """timm ``VisionTransformer`` whose ``rpc.rpc_layers`` use symmetric attention with PAP ("Sym/Asym")."""

    factory_kwargs = SymVisionTransformer.factory_kwargs  # the RPC settings its factory turns into ``rpc``

    def __init__(self, *args: Any, rpc: Optional[RpcConfig] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rpc = rpc or RpcConfig()
        for i in self.rpc.layer_indices(len(self.blocks)):
            old = self.blocks[i].attn
            sym = SymAttention(self.embed_dim, num_heads=old.num_heads, qkv_bias=old.qkv.bias is not None,
                               attn_drop=old.attn_drop.p, proj_drop=old.proj_drop.p)
            trunc_normal_(sym.qkv.weight, std=0.02)  # timm's ViT init for the replaced projections
            for lin in (sym.qkv, sym.proj):
                if lin.bias is not None:
                    torch.nn.init.zeros_(lin.bias)
            trunc_normal_(sym.proj.weight, std=0.02)
            sym.pap_iterations, sym.pap_lambda = self.rpc.pap_iterations, float(self.rpc.pap_lambda)
            sym.pap_convention = self.rpc.pap_convention
            self.blocks[i].attn = sym


def _create(variant: str, pretrained: bool = False, cls: type = RpcAsymVisionTransformer,
            **kwargs: Any) -> VisionTransformer:
    rpc = rpc_from_kwargs(kwargs, RPC_ASYM_DEFAULTS)
    return build_model_with_cfg(cls, variant, pretrained,
                                pretrained_filter_fn=partial(checkpoint_filter_fn, adapt_layer_scale=True),
                                feature_cfg=dict(out_indices=3, feature_cls="getter"), rpc=rpc, **kwargs)


default_cfgs = generate_default_cfgs({
    "rpc_deit_tiny_patch16_224": IMAGENET_CFG,
    "rpc_deit_digits_patch4_32": DIGITS_CFG,
    "rpc_symasym_deit_tiny_patch16_224": IMAGENET_CFG,
    "rpc_symasym_deit_digits_patch4_32": DIGITS_CFG,
})
_TINY = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3)


@register_model
def rpc_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> RpcAsymVisionTransformer:
    """RPC-AsymViT-tiny (RPC paper Table 14, 4iter/layer1): DeiT-tiny with PAP on the keys of layer 1."""
    return _create("rpc_deit_tiny_patch16_224", pretrained, **dict(_TINY, **kwargs))


@register_model
def rpc_deit_digits_patch4_32(pretrained: bool = False, **kwargs: Any) -> RpcAsymVisionTransformer:
    """RPC-AsymViT at the digits size (same trunk as ``deit_digits_patch4_32``)."""
    return _create("rpc_deit_digits_patch4_32", pretrained, **dict(DIGITS_ARCH, **kwargs))


@register_model
def rpc_symasym_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> SymAsymVisionTransformer:
    """RPC-AsymViT-tiny "Sym/Asym" (Table 14): symmetric PAP attention (4 iterations) in layer 1, q/k/v after."""
    return _create("rpc_symasym_deit_tiny_patch16_224", pretrained, SymAsymVisionTransformer, **dict(_TINY, **kwargs))


@register_model
def rpc_symasym_deit_digits_patch4_32(pretrained: bool = False, **kwargs: Any) -> SymAsymVisionTransformer:
    """"Sym/Asym" RPC at the digits size: symmetric PAP attention in layer 1, q/k/v attention after."""
    return _create("rpc_symasym_deit_digits_patch4_32", pretrained, SymAsymVisionTransformer,
                   **dict(DIGITS_ARCH, **kwargs))


from .zoo import ModelEntry, zoo  # noqa: E402  (after the timm registrations above)

zoo.add("rpc_deit", ModelEntry(
    "rpc_deit", "RPC-AsymViT (RPC Table 14, 4iter/layer1): DeiT with PAP on the keys, lambda 4",
    archs={"digits": "rpc_deit_digits_patch4_32", "imagenet": "rpc_deit_tiny_patch16_224"},
    default_checkpoints={"digits": "embedded:rpc_deit_digits"},
    arch_kwargs=dict(RPC_ASYM_DEFAULTS, pap_convention="authors"),
    crop_pct={"imagenet": 0.875},
))
zoo.add("rpc_symasym_deit", ModelEntry(
    "rpc_symasym_deit", "RPC-AsymViT (RPC Table 14, Sym/Asym): symmetric PAP attention in layer 1 (4 iterations, "
                        "lambda 4), q/k/v attention after",
    archs={"digits": "rpc_symasym_deit_digits_patch4_32", "imagenet": "rpc_symasym_deit_tiny_patch16_224"},
    default_checkpoints={"digits": "embedded:rpc_symasym_deit_digits"},
    arch_kwargs=dict(RPC_ASYM_DEFAULTS, pap_convention="authors"),
    crop_pct={"imagenet": 0.875},
))
