"""FeatScale (Wang et al., "Anti-Oversmoothing in Deep Vision Transformers via the Fourier Domain
Analysis", ICLR 2022) on DeiT and PID DeiT: the models of PIDformer Table 6.

Attention acts as a low-pass filter over tokens; FeatScale re-weights the two frequency parts of each
block's attention output with learned per-channel scales before the residual add:

    a = attn(norm1(x)),  a_DC = mean over tokens of a,  a_HF = a - a_DC
    x = x + (a + lamb1 * a_DC + lamb2 * a_HF)

``lamb1`` (DC) and ``lamb2`` (high frequency) are ``blocks.i.lamb1`` / ``blocks.i.lamb2``, shape
(dim,), initialised to zero, as named in the authors' public code (VITA-Group/ViT-Anti-Oversmoothing),
so a FeatScale checkpoint loads as it is; every other key is timm's ``VisionTransformer``'s (DeiT).
With zero scales a FeatScale model equals its base model. PID DeiT + FeatScale puts the same scales
on PID DeiT's blocks (the PID terms are inside ``attn``, so FeatScale sees the controlled output).

``featscale_add`` (an architecture argument, recorded in ``arch_kwargs['featscale']``): ``"once"``
(default) is the formula above, as in the paper, the authors' first DeiT version and their CaiT/Swin
blocks; ``"twice"`` is the authors' current DeiT block (``featscale.py`` after their April 2022
"bugfix to featscale" commit), which adds the scaled parts a second time in the residual:
``x + (a + 2 * (lamb1 * a_DC + lamb2 * a_HF))``. The weights are the same either way; a checkpoint
trained with that code needs ``featscale_add="twice"`` to give the logits it was trained to give.
"""
from __future__ import annotations

from functools import partial
from dataclasses import dataclass
from typing import Any, Dict, Optional

import torch
from timm.models import generate_default_cfgs, register_model
from timm.models._builder import build_model_with_cfg
from timm.models.vision_transformer import Block, VisionTransformer, checkpoint_filter_fn
from torch import nn

from .configs import DIGITS_CFG, IMAGENET_CFG
from .pid_vit import DIGITS_ARCH, PidBlock, PidState, PidVisionTransformer, gains_from_kwargs

__all__ = ["feat_scale", "FeatScaleBlock", "PidFeatScaleBlock", "FeatScaleSettings", "FEATSCALE_ADD",
           "checkpoint_filter_fn"]

FEATSCALE_ADD = ("once", "twice")


@dataclass(frozen=True)
class FeatScaleSettings:
    """How the scaled parts enter the residual; kept on the model for provenance (``arch_kwargs``)."""

    featscale_add: str = "once"

    def __post_init__(self) -> None:
        if self.featscale_add not in FEATSCALE_ADD:
            valid = ", ".join(map(repr, FEATSCALE_ADD))
            raise ValueError(f"featscale_add must be one of {valid}, got {self.featscale_add!r}")

    def as_dict(self) -> Dict[str, Any]:
        return {"featscale_add": self.featscale_add}


def feat_scale(a: torch.Tensor, lamb1: torch.Tensor, lamb2: torch.Tensor, add: str = "once") -> torch.Tensor:
    """``a + lamb1 * DC(a) + lamb2 * HF(a)`` for tokens ``a`` (B, N, C); DC is the mean over tokens.

    ``add="twice"`` adds ``lamb1 * DC(a) + lamb2 * HF(a)`` once more, in the order the authors' current
    DeiT block sums it (see the module docstring)."""
    dc = a.mean(dim=-2, keepdim=True)
    d, h = lamb1 * dc, lamb2 * (a - dc)
    out = a + d + h
    return out + d + h if add == "twice" else out


def _add_scales(block: nn.Module, dim: int) -> None:
    block.lamb1 = nn.Parameter(torch.zeros(dim))  # DC scale
    block.lamb2 = nn.Parameter(torch.zeros(dim))  # high-frequency scale


class FeatScaleBlock(Block):
    """timm ``Block`` with FeatScale on the attention output."""

    featscale_add = "once"  # set per model by the factories (``featscale_add=``)

    def __init__(self, dim: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(dim, *args, **kwargs)
        _add_scales(self, dim)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, **_: Any) -> torch.Tensor:  # type: ignore[override]
        a = self.attn(self.norm1(x), attn_mask=attn_mask)
        a = feat_scale(a, self.lamb1, self.lamb2, self.featscale_add)
        x = x + self.drop_path1(self.ls1(a))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class PidFeatScaleBlock(PidBlock):
    """PID DeiT's block with FeatScale on the (PID-controlled) attention output."""

    featscale_add = "once"

    def __init__(self, dim: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(dim, *args, **kwargs)
        _add_scales(self, dim)

    def forward(self, x: torch.Tensor, state: Optional[PidState] = None, **_: Any) -> torch.Tensor:  # type: ignore[override]
        a = self.attn(self.norm1(x), state=state)
        a = feat_scale(a, self.lamb1, self.lamb2, self.featscale_add)
        x = x + self.drop_path1(self.ls1(a))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


def _build(cls: type, variant: str, pretrained: bool, **kwargs: Any) -> VisionTransformer:
    return build_model_with_cfg(cls, variant, pretrained,
                                pretrained_filter_fn=partial(checkpoint_filter_fn, adapt_layer_scale=True),
                                feature_cfg=dict(out_indices=3, feature_cls="getter"), **kwargs)


def _set_add(net: VisionTransformer, add: str) -> VisionTransformer:
    net.featscale = FeatScaleSettings(add)  # validates; recorded by zoo.robustness_settings
    for blk in net.blocks:
        blk.featscale_add = add
    return net


def _create_deit(variant: str, pretrained: bool = False, featscale_add: str = "once",
                 **kwargs: Any) -> VisionTransformer:
    FeatScaleSettings(featscale_add)  # a bad value fails before the build
    return _set_add(_build(VisionTransformer, variant, pretrained, block_fn=FeatScaleBlock, **kwargs), featscale_add)


def _create_pid(variant: str, pretrained: bool = False, featscale_add: str = "once",
                **kwargs: Any) -> PidVisionTransformer:
    FeatScaleSettings(featscale_add)
    gains = kwargs.pop("gains", None) or gains_from_kwargs(kwargs)
    net = _build(PidVisionTransformer, variant, pretrained, gains=gains, block_fn=PidFeatScaleBlock, **kwargs)
    return _set_add(net, featscale_add)


_TINY = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3)  # DeiT-tiny, as in Table 6

default_cfgs = generate_default_cfgs({
    "featscale_deit_tiny_patch16_224": IMAGENET_CFG,
    "pid_featscale_deit_tiny_patch16_224": IMAGENET_CFG,
    "featscale_deit_digits_patch4_32": DIGITS_CFG,
    "pid_featscale_deit_digits_patch4_32": DIGITS_CFG,
})


@register_model
def featscale_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """DeiT-tiny + FeatScale (PIDformer Table 6)."""
    return _create_deit("featscale_deit_tiny_patch16_224", pretrained, **dict(_TINY, **kwargs))


@register_model
def pid_featscale_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> PidVisionTransformer:
    """PID DeiT-tiny + FeatScale (PIDformer Table 6)."""
    return _create_pid("pid_featscale_deit_tiny_patch16_224", pretrained, **dict(_TINY, **kwargs))


@register_model
def featscale_deit_digits_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """DeiT + FeatScale at the digits size (same trunk as ``deit_digits_patch4_32``)."""
    return _create_deit("featscale_deit_digits_patch4_32", pretrained, **dict(DIGITS_ARCH, **kwargs))


@register_model
def pid_featscale_deit_digits_patch4_32(pretrained: bool = False, **kwargs: Any) -> PidVisionTransformer:
    """PID DeiT + FeatScale at the digits size (same trunk as ``pid_deit_digits_patch4_32``)."""
    return _create_pid("pid_featscale_deit_digits_patch4_32", pretrained, **dict(DIGITS_ARCH, **kwargs))


for _fn in (featscale_deit_tiny_patch16_224, pid_featscale_deit_tiny_patch16_224, featscale_deit_digits_patch4_32,
            pid_featscale_deit_digits_patch4_32):
    _fn.factory_kwargs = ("featscale_add",)  # type: ignore[attr-defined]  (read by zoo.check_arch_kwargs)

from .zoo import ModelEntry, zoo  # noqa: E402  (after the timm registrations above)

zoo.add("featscale_deit", ModelEntry(
    "featscale_deit", "DeiT + FeatScale (PIDformer Table 6): learned DC/high-frequency scales per block",
    archs={"digits": "featscale_deit_digits_patch4_32", "imagenet": "featscale_deit_tiny_patch16_224"},
    default_checkpoints={"digits": "embedded:featscale_deit_digits"},
    crop_pct={"imagenet": 0.875},
))
zoo.add("pid_featscale_deit", ModelEntry(
    "pid_featscale_deit", "PID DeiT + FeatScale (PIDformer Table 6)",
    archs={"digits": "pid_featscale_deit_digits_patch4_32", "imagenet": "pid_featscale_deit_tiny_patch16_224"},
    default_checkpoints={"digits": "embedded:pid_featscale_deit_digits"},
    crop_pct={"imagenet": 0.875},
))
