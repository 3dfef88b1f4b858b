"""PID-FAN (PIDformer, Nguyen et al. 2024, Table 4): FAN-ViT whose token-mixing attention carries the
PID controller of PID DeiT.

Each FAN block's token mixing outputs ``softmax(q k^T / sqrt(d)) v + lP e + lI sum(e) + lD (e - e_prev)``
with ``e = beta * v^0 - v`` exactly as in ``pid_vit.py``, whose ``pid_control`` / ``PidState`` /
``PidGains`` are used as they are (one controller implementation for every PID model). The channel
processing MLP and the class-attention blocks are FAN's, untouched, and the controller adds no
parameters: a FAN checkpoint loads into PID-FAN and with zero gains PID-FAN is FAN.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from timm.models import generate_default_cfgs, register_model

from .fan import (FAN_CFG, FAN_DIGITS, FAN_DIGITS_CFG, FAN_SIZES, FanVisionTransformer, TokenMixing,
                  checkpoint_filter_fn, create_fan)
from .pid_vit import PidGains, PidState, PidVisionTransformer, gains_from_kwargs, pid_control

__all__ = ["PidTokenMixing", "PidFanVisionTransformer", "checkpoint_filter_fn"]


class PidTokenMixing(TokenMixing):
    """FAN token mixing (same parameters) plus the PID control terms of the value tensor."""

    gains: PidGains = PidGains()

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,  # type: ignore[override]
            state: Optional[PidState] = None, **_: Any) -> torch.Tensor:
        if state is None:
            raise RuntimeError("PidTokenMixing needs the controller state of the current forward pass; "
                               "call it through PidFanVisionTransformer, not on its own.")
        return super().mix(q, k, v) + pid_control(v, state, self.gains)


class PidFanVisionTransformer(FanVisionTransformer):
    """FAN-ViT with PID token mixing in every block; ``gains`` default to PID DeiT's (A.1)."""

    factory_kwargs = PidVisionTransformer.factory_kwargs  # the PID gains its factory turns into ``gains``

    def __init__(self, *args: Any, gains: Optional[PidGains] = None, **kwargs: Any) -> None:
        kwargs["attn_layer"] = PidTokenMixing
        super().__init__(*args, **kwargs)
        self.gains = gains or PidGains()
        for blk in self.blocks:
            blk.attn.gains = self.gains

    def mix_kwargs(self) -> Dict[str, Any]:
        return {"state": PidState()}  # a fresh controller per forward pass


def _create(variant: str, pretrained: bool = False, **kwargs: Any) -> PidFanVisionTransformer:
    gains = kwargs.pop("gains", None) or gains_from_kwargs(kwargs)
    return create_fan(PidFanVisionTransformer, variant, pretrained, gains=gains, **kwargs)


default_cfgs = generate_default_cfgs({
    "pid_fan_tiny_12_p16_224": FAN_CFG,
    "pid_fan_small_12_p16_224": FAN_CFG,
    "pid_fan_base_18_p16_224": FAN_CFG,
    "pid_fan_large_24_p16_224": FAN_CFG,
    "pid_fan_digits_patch4_32": FAN_DIGITS_CFG,
})


@register_model
def pid_fan_tiny_12_p16_224(pretrained: bool = False, **kwargs: Any) -> PidFanVisionTransformer:
    """PID-FAN-tiny (PIDformer Table 4): FAN-ViT-tiny with PID token mixing."""
    return _create("pid_fan_tiny_12_p16_224", pretrained, **dict(FAN_SIZES["tiny"], **kwargs))


@register_model
def pid_fan_small_12_p16_224(pretrained: bool = False, **kwargs: Any) -> PidFanVisionTransformer:
    """PID-FAN-small: FAN-ViT-small with PID token mixing."""
    return _create("pid_fan_small_12_p16_224", pretrained, **dict(FAN_SIZES["small"], **kwargs))


@register_model
def pid_fan_base_18_p16_224(pretrained: bool = False, **kwargs: Any) -> PidFanVisionTransformer:
    """PID-FAN-base: FAN-ViT-base with PID token mixing."""
    return _create("pid_fan_base_18_p16_224", pretrained, **dict(FAN_SIZES["base"], **kwargs))


@register_model
def pid_fan_large_24_p16_224(pretrained: bool = False, **kwargs: Any) -> PidFanVisionTransformer:
    """PID-FAN-large: FAN-ViT-large with PID token mixing."""
    return _create("pid_fan_large_24_p16_224", pretrained, **dict(FAN_SIZES["large"], **kwargs))


@register_model
def pid_fan_digits_patch4_32(pretrained: bool = False, **kwargs: Any) -> PidFanVisionTransformer:
    """PID-FAN at the digits size: same architecture as ``fan_digits_patch4_32``."""
    return _create("pid_fan_digits_patch4_32", pretrained, **dict(FAN_DIGITS, **kwargs))


from .zoo import ModelEntry, zoo  # noqa: E402  (after the timm registrations above)

zoo.add("pid_fan", ModelEntry(
    "pid_fan", "PID-FAN (PIDformer Table 4): FAN with PID token mixing; lP .8, lI .5, lD .05, beta .1",
    archs={"digits": "pid_fan_digits_patch4_32", "imagenet": "pid_fan_tiny_12_p16_224"},
    default_checkpoints={"digits": "embedded:pid_fan_digits"},
))
