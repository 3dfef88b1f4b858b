"""PID-controlled vision transformer (PIDformer, Nguyen et al., ICML 2024, Definition 1).

Per head and per token, layer ``l`` of a PIDformer outputs

    u^l = softmax(q k^T / sqrt(d)) v^l + lP e^l + lI sum_{m<=l} e^m + lD (e^l - e^{l-1}),
    e^l = beta * v^0 - v^l,

where ``v^l`` is the value tensor of layer ``l`` and ``v^0`` the value tensor of the first layer.
``u^l`` then goes through the usual head merge and output projection.

First-layer derivative: the paper leaves ``e^{l-1}`` undefined at the first layer. We take
``e^0 = 0`` (the controller starts from rest, as the paper's ODE sets ``z(x, 0) = 0``), so the
derivative term at layer 1 is ``lD * e^1``. This choice is exposed as ``PidGains.first_derivative``
(``"zero-error"`` or ``"none"``; the latter drops the D term at layer 1).

The softmax part always goes through ``F.scaled_dot_product_attention`` (fused kernels on GPU);
the PID terms are elementwise. The controller state lives in a ``PidState`` created inside
``forward_features`` and passed explicitly block to block, so it never outlives one forward pass
and never leaks across batches or threads.

Parameter names are exactly timm's ``VisionTransformer`` names, so a DeiT checkpoint loads into a
PID DeiT (the PID terms add no parameters).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F
from timm.layers import Attention
from timm.models import generate_default_cfgs, register_model
from timm.models._builder import build_model_with_cfg
from timm.models.vision_transformer import Block, VisionTransformer, checkpoint_filter_fn

from .configs import DIGITS_CFG, IMAGENET_CFG


@dataclass(frozen=True)
class PidGains:
    """PID controller gains and reference scale. Defaults: PIDformer appendix A.1 (ImageNet)."""

    lambda_p: float = 0.8
    lambda_i: float = 0.5
    lambda_d: float = 0.05
    beta: float = 0.1
    first_derivative: str = "zero-error"  # e^0 = 0; "none" drops the D term at layer 1

    def __post_init__(self) -> None:
        negative = [k for k in ("lambda_p", "lambda_i", "lambda_d", "beta") if getattr(self, k) < 0]
        if negative:  # 0 switches a term off (an ablation); a negative gain inverts the controller
            raise ValueError(f"PID gains must be >= 0 (PIDformer: lambda > 0, beta in (0, 1]; 0 switches a term "
                             f"off), got {', '.join(f'{k}={getattr(self, k)!r}' for k in negative)}")
        if self.beta > 1:
            raise ValueError(f"beta must be at most 1 (PIDformer: beta in (0, 1]), got {self.beta!r}")
        if self.first_derivative not in ("zero-error", "none"):
            raise ValueError(
                f"first_derivative must be 'zero-error' or 'none', got {self.first_derivative!r}"
            )

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


class PidState:
    """Controller memory for one forward pass: beta * v^0, running sum of errors, previous error."""

    __slots__ = ("reference", "error_sum", "prev_error", "layer")

    def __init__(self) -> None:
        self.reference: Optional[torch.Tensor] = None  # beta * v^0, computed once at the first layer
        self.error_sum: Optional[torch.Tensor] = None
        self.prev_error: Optional[torch.Tensor] = None
        self.layer = 0


class PidAttention(Attention):
    """timm ``Attention`` (same parameters) whose output adds the PID control terms."""

    def __init__(self, dim: int, *args: Any, gains: PidGains = PidGains(), **kwargs: Any) -> None:
        super().__init__(dim, *args, **kwargs)
        self.gains = gains

    def forward(self, x: torch.Tensor, state: Optional[PidState] = None, **_: Any) -> torch.Tensor:  # type: ignore[override]
        if state is None:
            raise RuntimeError(
                "PidAttention needs the controller state of the current forward pass; "
                "call it through PidVisionTransformer, not on its own."
            )
        B, N, _ = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0
        )
        out = out + pid_control(v, state, self.gains)
        out = out.transpose(1, 2).reshape(B, N, self.attn_dim)
        out = self.norm(out)
        out = self.proj(out)
        return self.proj_drop(out)


def pid_control(v: torch.Tensor, state: PidState, g: PidGains) -> torch.Tensor:
    """Return lP e + lI sum(e) + lD (e - e_prev) for this layer and advance ``state``.

    Written as (lP + lD) e + lI sum(e) - lD e_prev so the controller costs six elementwise passes
    over the value tensor (``scripts/bench_attention.py`` measures it against softmax attention).
    """
    if state.reference is None:
        state.reference = g.beta * v
    error = state.reference - v
    error_sum = error if state.error_sum is None else state.error_sum + error
    if state.prev_error is None:  # first layer: e^0 = 0 ("zero-error") or no D term ("none")
        gain_e = g.lambda_p + (g.lambda_d if g.first_derivative == "zero-error" else 0.0)
        out = torch.add(error * gain_e, error_sum, alpha=g.lambda_i)
    else:
        out = torch.add(error * (g.lambda_p + g.lambda_d), error_sum, alpha=g.lambda_i)
        out = out.sub_(state.prev_error, alpha=g.lambda_d)
    state.error_sum, state.prev_error = error_sum, error
    state.layer += 1
    return out


class PidBlock(Block):
    """timm ``Block`` whose attention receives the PID state."""

    def forward(self, x: torch.Tensor, state: Optional[PidState] = None, **_: Any) -> torch.Tensor:  # type: ignore[override]
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), state=state)))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x


class PidVisionTransformer(VisionTransformer):
    """timm ``VisionTransformer`` with PID attention in every block."""

    # arguments the model factory turns into ``gains`` (so --lambda-p etc. are valid for this class)
    factory_kwargs = ("lambda_p", "lambda_i", "lambda_d", "beta", "first_derivative")

    def __init__(self, *args: Any, gains: Optional[PidGains] = None, **kwargs: Any) -> None:
        gains = gains or PidGains()
        kwargs.setdefault("block_fn", PidBlock)  # a PidBlock subclass may be given (FeatScale)
        if not issubclass(kwargs["block_fn"], PidBlock):
            raise TypeError(f"block_fn must be a PidBlock subclass, got {kwargs['block_fn'].__name__}")
        kwargs["attn_layer"] = PidAttention  # timm needs a class here, so gains are set just below
        super().__init__(*args, **kwargs)
        self.gains = gains
        for blk in self.blocks:
            blk.attn.gains = gains

    def forward_features(self, x: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:  # type: ignore[override]
        x = self.patch_embed(x)
        x = self._pos_embed(x)
        x = self.patch_drop(x)
        x = self.norm_pre(x)
        state = PidState()  # local to this call: no state survives the forward pass
        for blk in self.blocks:
            x = blk(x, state=state)
        return self.norm(x)

    def forward_intermediates(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - guard
        raise NotImplementedError(
            "PidVisionTransformer does not support forward_intermediates; "
            "use robustbench_pid.probes.rank_collapse.token_representations (forward hooks) instead."
        )


def gains_from_kwargs(kwargs: Dict[str, Any]) -> PidGains:
    """Pop the PID settings given as model keywords (``lambda_p=...``) into a ``PidGains``."""
    names = ("lambda_p", "lambda_i", "lambda_d", "beta", "first_derivative")
    return PidGains(**{n: kwargs.pop(n) for n in names if n in kwargs})


def _create(cls: type, variant: str, pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    return build_model_with_cfg(
        cls,
        variant,
        pretrained,
        pretrained_filter_fn=partial(checkpoint_filter_fn, adapt_layer_scale=True),
        feature_cfg=dict(out_indices=3, feature_cls="getter"),
        **kwargs,
    )


def _create_pid(variant: str, pretrained: bool = False, **kwargs: Any) -> PidVisionTransformer:
    gains = kwargs.pop("gains", None) or gains_from_kwargs(kwargs)
    return _create(PidVisionTransformer, variant, pretrained, gains=gains, **kwargs)


def _create_vit(variant: str, pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    return _create(VisionTransformer, variant, pretrained, **kwargs)


# --- architectures -------------------------------------------------------------------------
# DeiT sizes follow timm's deit_{tiny,small,base}_patch16_224 exactly.
_DEIT = {
    "tiny": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),
    "small": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "base": dict(patch_size=16, embed_dim=768, depth=12, num_heads=12),
}
# The embedded-default (digits) size: 32x32 input, 4x4 patches (64 tokens + cls), 4 blocks.
DIGITS_ARCH = dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0, num_classes=10)


# timm's register_model picks these up from the module (pretrained cfg: mean/std, input size).
default_cfgs = generate_default_cfgs(
    {
        "pid_deit_tiny_patch16_224": IMAGENET_CFG,
        "pid_deit_small_patch16_224": IMAGENET_CFG,
        "pid_deit_base_patch16_224": IMAGENET_CFG,
        "deit_digits_patch4_32": DIGITS_CFG,
        "pid_deit_digits_patch4_32": DIGITS_CFG,
    }
)


@register_model
def pid_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> PidVisionTransformer:
    """PID DeiT-tiny (PIDformer Table 1 model)."""
    return _create_pid("pid_deit_tiny_patch16_224", pretrained, **dict(_DEIT["tiny"], **kwargs))


@register_model
def pid_deit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> PidVisionTransformer:
    """PID DeiT-small."""
    return _create_pid("pid_deit_small_patch16_224", pretrained, **dict(_DEIT["small"], **kwargs))


@register_model
def pid_deit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> PidVisionTransformer:
    """PID DeiT-base."""
    return _create_pid("pid_deit_base_patch16_224", pretrained, **dict(_DEIT["base"], **kwargs))


@register_model
def deit_digits_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Softmax DeiT for the embedded digits default (32x32, patch 4, 4 blocks, dim 64)."""
    return _create_vit("deit_digits_patch4_32", pretrained, **dict(DIGITS_ARCH, **kwargs))


@register_model
def pid_deit_digits_patch4_32(pretrained: bool = False, **kwargs: Any) -> PidVisionTransformer:
    """PID DeiT for the embedded digits default: same architecture as ``deit_digits_patch4_32``."""
    return _create_pid("pid_deit_digits_patch4_32", pretrained, **dict(DIGITS_ARCH, **kwargs))
