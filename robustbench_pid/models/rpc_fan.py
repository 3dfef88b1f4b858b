"""Symmetric FAN and RPC-FAN (RPC paper, Teo & Nguyen 2024, appendix E.7, Tables 9-10).

The RPC paper trains FAN-ViT-tiny with symmetric attention: the token mixing keeps only ``attn.kv``
(Linear(dim, 2*dim): k then v; there is no ``attn.q``) and attends ``softmax(k k^T / sqrt(d)) v``.
That model is the tables' "FAN-tiny (baseline)" (``symfan_*`` here). RPC-FAN-tiny replaces the
first layer's attention by 4 iterations of Principal Attention Pursuit with lambda 4 and
mu = N D / (4 ||K||_1) (``rpc_fan_*``). PAP and its settings are SymViT's (``symvit.pap_attention``,
``RpcConfig``, including the ``authors``/``paper`` readings of mu and the threshold), applied to FAN's
token mixing; FAN's channel MLP and class-attention blocks are unchanged. With zero PAP iterations
RPC-FAN is exactly symmetric FAN.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
from timm.models import generate_default_cfgs, register_model

from .fan import (FAN_CFG, FAN_DIGITS, FAN_DIGITS_CFG, FAN_SIZES, FanVisionTransformer, TokenMixing,
                  checkpoint_filter_fn, create_fan)
from .symvit import RpcConfig, SymVisionTransformer, assign_pap, pap_attention, rpc_from_kwargs

__all__ = ["SymTokenMixing", "SymFanVisionTransformer", "RPC_FAN_DEFAULTS", "checkpoint_filter_fn"]

# Tables 9-10: RPC-FAN-tiny (4iter/layer1), lambda 4.
RPC_FAN_DEFAULTS: Dict[str, Any] = dict(pap_iterations=4, pap_lambda=4.0, rpc_layers="first")


class SymTokenMixing(TokenMixing):
    """FAN token mixing with symmetric attention: ``kv`` gives k and v, keys act as queries; PAP optional."""

    def __init__(self, dim: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(dim, *args, **kwargs)
        del self.q  # symmetric attention has no query projection
        self.pap_iterations = 0
        self.pap_lambda = 4.0
        self.pap_convention = "authors"

    def project(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        k, v = self.kv(x).chunk(2, dim=-1)
        k = self._heads(k)
        return k, k, self._heads(v)

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **_: Any) -> torch.Tensor:
        p = self.attn_drop.p if self.training else 0.0
        return pap_attention(k, v, self.pap_iterations, self.pap_lambda, convention=self.pap_convention,
                             model_dim=self.num_heads * self.head_dim, dropout_p=p)


class SymFanVisionTransformer(FanVisionTransformer):
    """FAN-ViT with symmetric token mixing; RPC-Attention (PAP) in ``rpc.rpc_layers``."""

    factory_kwargs = SymVisionTransformer.factory_kwargs  # the RPC settings its factory turns into ``rpc``

    def __init__(self, *args: Any, rpc: Optional[RpcConfig] = None, **kwargs: Any) -> None:
        kwargs["attn_layer"] = SymTokenMixing
        super().__init__(*args, **kwargs)
        self.rpc = rpc or RpcConfig()
        assign_pap([blk.attn for blk in self.blocks], self.rpc)


def _create(variant: str, pretrained: bool = False, rpc_defaults: Optional[Dict[str, Any]] = None,
            **kwargs: Any) -> SymFanVisionTransformer:
    rpc = rpc_from_kwargs(kwargs, rpc_defaults)
    return create_fan(SymFanVisionTransformer, variant, pretrained, rpc=rpc, **kwargs)


default_cfgs = generate_default_cfgs({
    "symfan_tiny_12_p16_224": FAN_CFG,
    "rpc_fan_tiny_12_p16_224": FAN_CFG,
    "symfan_digits_patch4_32": FAN_DIGITS_CFG,
    "rpc_fan_digits_patch4_32": FAN_DIGITS_CFG,
})


@register_model
def symfan_tiny_12_p16_224(pretrained: bool = False, **kwargs: Any) -> SymFanVisionTransformer:
    """Symmetric FAN-tiny: the RPC paper's FAN-tiny baseline (Tables 9-10)."""
    return _create("symfan_tiny_12_p16_224", pretrained, **dict(FAN_SIZES["tiny"], **kwargs))


@register_model
def rpc_fan_tiny_12_p16_224(pretrained: bool = False, **kwargs: Any) -> SymFanVisionTransformer:
    """RPC-FAN-tiny (Tables 9-10): symmetric FAN-tiny with PAP (4 iterations, lambda 4) in layer 1."""
    return _create("rpc_fan_tiny_12_p16_224", pretrained, RPC_FAN_DEFAULTS, **dict(FAN_SIZES["tiny"], **kwargs))


@register_model
def symfan_digits_patch4_32(pretrained: bool = False, **kwargs: Any) -> SymFanVisionTransformer:
    """Symmetric FAN at the digits size (32x32, 4x4 conv stem, 4 blocks, width 64)."""
    return _create("symfan_digits_patch4_32", pretrained, **dict(FAN_DIGITS, **kwargs))


@register_model
def rpc_fan_digits_patch4_32(pretrained: bool = False, **kwargs: Any) -> SymFanVisionTransformer:
    """RPC-FAN at the digits size: PAP (4 iterations, lambda 4) in layer 1."""
    return _create("rpc_fan_digits_patch4_32", pretrained, RPC_FAN_DEFAULTS, **dict(FAN_DIGITS, **kwargs))


from .zoo import ModelEntry, zoo  # noqa: E402  (after the timm registrations above)

zoo.add("symfan", ModelEntry(
    "symfan", "symmetric FAN-tiny: attn.kv only, softmax(k k^T) v; the RPC paper's FAN baseline",
    archs={"digits": "symfan_digits_patch4_32", "imagenet": "symfan_tiny_12_p16_224"},
    default_checkpoints={"digits": "embedded:symfan_digits"},
))
zoo.add("rpc_fan", ModelEntry(
    "rpc_fan", "RPC-FAN-tiny (RPC Tables 9-10): symmetric FAN, PAP 4 iterations, lambda 4, layer 1",
    archs={"digits": "rpc_fan_digits_patch4_32", "imagenet": "rpc_fan_tiny_12_p16_224"},
    default_checkpoints={"digits": "embedded:rpc_fan_digits"},
    arch_kwargs=dict(RPC_FAN_DEFAULTS, pap_convention="authors"),
))
