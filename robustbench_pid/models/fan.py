"""FAN-ViT (Fully Attentional Networks, Zhou et al., ICML 2022), registered with timm.

Why our own module: the installed timm (1.0.x) does not ship FAN (``timm.list_models('fan*')`` is
empty), and NVlabs' code is under a non-commercial licence, so the architecture is written here from
the paper and the documented module layout of the released checkpoints. What timm does provide is
reused as is: FAN grew out of XCiT, and XCiT's convolutional patch embedding, Fourier positional
encoding and class-attention block (``timm.models.xcit``) have exactly FAN's parameter names and
behaviour. Only the two FAN-specific pieces are written here:

* ``TokenMixing`` (``attn.q``, ``attn.kv``, ``attn.proj``): softmax self-attention with a separate
  query projection and a joint key/value projection. Subclasses change how ``q, k, v`` are mixed
  (PID-FAN in ``pid_fan.py``, symmetric/RPC-FAN in ``rpc_fan.py``) through ``mix``.
* ``ChannelProcessing`` (``mlp.*``): the "fully attentional" channel MLP. The value path is an MLP
  with a depth-wise conv branch (``mlp_v``: fc1, ``h + gamma * dwconv(h)``, fc2) and a LayerNorm
  (``norm_v``); each output channel is then gated by a channel attention
  ``sigmoid(softmax_N(q)^T mean_d(softmax_N(x))) * temperature``, one weight per head channel.

Behaviour kept from the released models so their checkpoints reproduce: the channel MLP applies no
activation after ``fc1`` (only the GELU inside the dwconv branch), ``norm_v`` uses LayerNorm's default
eps (1e-5) while the block norms use 1e-6, and the class-attention block (timm's XCiT one, with
``tokens_norm=True``) adds the normalized patch tokens to themselves.

Layout of a block: ``x + gamma1 * attn(norm1(x))`` then ``x + gamma2 * mlp(norm2(x), H, W)``; after
the blocks a class token is prepended and two class-attention blocks, ``norm`` and ``head`` follow.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Dict, Optional, Tuple, Type

import torch
import torch.nn.functional as F
from timm.layers import DropPath, to_2tuple, trunc_normal_
from timm.models import generate_default_cfgs, register_model
from timm.models._builder import build_model_with_cfg
from timm.models import xcit
from torch import nn

from .configs import DIGITS_CFG, IMAGENET_CFG

# FAN evaluates at 224 with no resize/crop margin (crop_pct 1.0), bicubic, ImageNet mean/std.
FAN_CFG: Dict[str, Any] = dict(IMAGENET_CFG, crop_pct=1.0, first_conv="patch_embed.proj.0.0")
FAN_DIGITS_CFG: Dict[str, Any] = dict(DIGITS_CFG, first_conv="patch_embed.proj.0.0")


class ConvPatchEmbed(xcit.ConvPatchEmbed):
    """timm's XCiT conv stem (stride-2 3x3 conv + BN, GELU between) plus the 4x4 stem FAN also has.

    Patch 4 (two convs, ``proj.0`` and ``proj.2``) serves the 32x32 digits models.
    """

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, embed_dim: int = 768,
                 act_layer: Type[nn.Module] = nn.GELU) -> None:
        if patch_size in (8, 16):
            super().__init__(img_size, patch_size, in_chans, embed_dim, act_layer)
        elif patch_size == 4:
            nn.Module.__init__(self)
            size = to_2tuple(img_size)
            self.img_size, self.num_patches = size, (size[0] // 4) * (size[1] // 4)
            self.proj = nn.Sequential(xcit.conv3x3(in_chans, embed_dim // 4, 2), act_layer(),
                                      xcit.conv3x3(embed_dim // 4, embed_dim, 2))
        else:
            raise ValueError(f"FAN's convolutional patch embedding takes patch_size 4, 8 or 16, got {patch_size}")
        self.patch_size = to_2tuple(patch_size)  # a pair, like every other timm patch embedding


class TokenMixing(nn.Module):
    """FAN's token-mixing self-attention: ``q`` (dim x dim), ``kv`` (2*dim x dim: k then v), ``proj``."""

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, attn_drop: float = 0.0,
                 proj_drop: float = 0.0) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        B, N, _ = t.shape
        return t.reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)

    def project(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, N, C) -> q, k, v of shape (B, H, N, d)."""
        k, v = self.kv(x).chunk(2, dim=-1)
        return self._heads(self.q(x)), self._heads(k), self._heads(v)

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **_: Any) -> torch.Tensor:
        """softmax(q k^T / sqrt(d)) v per head."""
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)

    def forward(self, x: torch.Tensor, **mix_kwargs: Any) -> torch.Tensor:
        B, N, C = x.shape
        out = self.mix(*self.project(x), **mix_kwargs)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, N, C)))


class DWConv(nn.Module):
    """Depth-wise 3x3 conv, GELU, BatchNorm, depth-wise 3x3 conv on the token grid (``mlp_v.dwconv``)."""

    def __init__(self, dim: int, act_layer: Type[nn.Module] = nn.GELU) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.act = act_layer()
        self.bn = nn.BatchNorm2d(dim)
        self.conv2 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
        B, N, C = x.shape
        g = x.transpose(1, 2).reshape(B, C, H, W)
        g = self.conv2(self.bn(self.act(self.conv1(g))))
        return g.reshape(B, C, N).transpose(1, 2)


class ConvMlp(nn.Module):
    """``fc1``, then ``h + gamma * dwconv(h)`` (a learned-scale conv branch), then ``fc2``."""

    def __init__(self, dim: int, hidden: int, act_layer: Type[nn.Module] = nn.GELU, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = DWConv(hidden, act_layer)
        self.gamma = nn.Parameter(torch.ones(hidden))
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
        h = self.fc1(x)
        h = h + self.drop(self.gamma * self.dwconv(h, H, W))
        return self.drop(self.fc2(h))


class ChannelProcessing(nn.Module):
    """FAN's channel attention MLP: ``norm_v(mlp_v(x))`` gated per channel by a channel attention."""

    def __init__(self, dim: int, num_heads: int = 8, mlp_ratio: float = 4.0, qkv_bias: bool = False,
                 attn_drop: float = 0.0, drop: float = 0.0, act_layer: Type[nn.Module] = nn.GELU) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.mlp_v = ConvMlp(dim, int(dim * mlp_ratio), act_layer, drop)
        self.norm_v = nn.LayerNorm(dim)  # LayerNorm's default eps, as in the released models
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)

    def channel_attention(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, C) -> (B, 1, C): sigmoid(sum_n softmax_n(q)[n, c] * mean_c' softmax_n(x)[n, c']) * t_h."""
        B, N, C = x.shape
        h = self.num_heads
        q = self.q(x).reshape(B, N, h, C // h).softmax(dim=1)
        k = x.reshape(B, N, h, C // h).softmax(dim=1).mean(dim=-1)  # (B, N, h)
        a = torch.sigmoid(torch.einsum("bnhd,bnh->bhd", q, k)) * self.temperature.view(1, h, 1)
        return self.attn_drop(a).reshape(B, 1, C)

    def forward(self, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
        return self.norm_v(self.mlp_v(x, H, W)) * self.channel_attention(x)


class FanBlock(nn.Module):
    """``x + gamma1 * attn(norm1(x))``, then ``x + gamma2 * mlp(norm2(x))`` (layer scale ``eta``)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 proj_drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0, eta: float = 1.0,
                 attn_layer: Type[TokenMixing] = TokenMixing, act_layer: Type[nn.Module] = nn.GELU,
                 norm_layer: Any = partial(nn.LayerNorm, eps=1e-6)) -> None:
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = attn_layer(dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = ChannelProcessing(dim, num_heads, mlp_ratio, qkv_bias, attn_drop, proj_drop, act_layer)
        self.gamma1 = nn.Parameter(eta * torch.ones(dim))
        self.gamma2 = nn.Parameter(eta * torch.ones(dim))

    def forward(self, x: torch.Tensor, H: int, W: int, **mix_kwargs: Any) -> torch.Tensor:
        x = x + self.drop_path(self.gamma1 * self.attn(self.norm1(x), **mix_kwargs))
        return x + self.drop_path(self.gamma2 * self.mlp(self.norm2(x), H, W))


class FanVisionTransformer(nn.Module):
    """FAN-ViT: conv stem, Fourier positions, FAN blocks, class-attention blocks, norm, linear head.

    ``attn_layer`` picks the token-mixing attention (the hook the PID and RPC variants use);
    ``mix_kwargs`` gives the per-forward extra arguments every block's attention receives.
    """

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, num_classes: int = 1000,
                 embed_dim: int = 192, depth: int = 12, num_heads: int = 4, mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, cls_attn_layers: int = 2, eta: float = 1.0, tokens_norm: bool = True,
                 attn_layer: Type[TokenMixing] = TokenMixing, global_pool: str = "token") -> None:
        super().__init__()
        if global_pool != "token":
            raise ValueError(f"FAN classifies from its class token (global_pool='token'), got {global_pool!r}")
        norm_layer = partial(nn.LayerNorm, eps=1e-6)
        self.num_classes, self.global_pool = num_classes, global_pool
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.patch_embed = ConvPatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.pos_embed = xcit.PositionalEncodingFourier(dim=embed_dim)
        self.pos_drop = nn.Dropout(drop_rate)
        self.blocks = nn.ModuleList([
            FanBlock(embed_dim, num_heads, mlp_ratio, qkv_bias, drop_rate, attn_drop_rate, drop_path_rate, eta,
                     attn_layer=attn_layer, norm_layer=norm_layer)
            for _ in range(depth)])
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.cls_attn_blocks = nn.ModuleList([
            xcit.ClassAttentionBlock(embed_dim, num_heads, mlp_ratio, qkv_bias, proj_drop=drop_rate,
                                     attn_drop=attn_drop_rate, norm_layer=norm_layer, eta=eta, tokens_norm=tokens_norm)
            for _ in range(cls_attn_layers)])
        self.norm = norm_layer(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        trunc_normal_(self.cls_token, std=0.02)
        self.apply(_init_weights)

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return {"pos_embed", "cls_token"}

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        self.num_classes = num_classes
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    def mix_kwargs(self) -> Dict[str, Any]:
        """Extra arguments for every block's token mixing in one forward pass (none for plain FAN)."""
        return {}

    def forward_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Images -> patch tokens after the FAN blocks (B, N, C), before the class token is added."""
        x, (H, W) = self.patch_embed(x)
        x = x + self.pos_embed(x.shape[0], H, W).reshape(x.shape[0], -1, x.shape[1]).transpose(1, 2)
        x = self.pos_drop(x)
        kw = self.mix_kwargs()  # created per call: no state outlives one forward pass
        for blk in self.blocks:
            x = blk(x, H, W, **kw)
        return x

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.forward_tokens(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        for blk in self.cls_attn_blocks:
            x = blk(x)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = x[:, 0]
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def _init_weights(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)


def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: nn.Module) -> Dict[str, torch.Tensor]:
    """timm's XCiT filter: FAN shares its quirks (``pos_embeder.`` -> ``pos_embed.``, class-attention
    ``qkv`` split into ``q``/``k``/``v``); every other key is FAN's own."""
    return xcit.checkpoint_filter_fn(state_dict, model)


def create_fan(cls: type, variant: str, pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """Build a FAN-family model with timm's builder (pretrained cfg, no download: our urls are empty)."""
    return build_model_with_cfg(cls, variant, pretrained, pretrained_filter_fn=checkpoint_filter_fn, **kwargs)


# NVlabs/FAN sizes (fan_*_p16_224): width, depth, heads. Published sizes: 7.3M, 28.0M, 54.0M, 80.5M.
FAN_SIZES: Dict[str, Dict[str, Any]] = {
    "tiny": dict(patch_size=16, embed_dim=192, depth=12, num_heads=4),
    "small": dict(patch_size=16, embed_dim=384, depth=12, num_heads=8),
    "base": dict(patch_size=16, embed_dim=448, depth=18, num_heads=8),
    "large": dict(patch_size=16, embed_dim=480, depth=24, num_heads=10),
}
FAN_NAMES = {"tiny": "fan_tiny_12_p16_224", "small": "fan_small_12_p16_224",
             "base": "fan_base_18_p16_224", "large": "fan_large_24_p16_224"}
# The embedded-default (digits) size, as the other *_digits_patch4_32 models: 8x8 tokens, 4 blocks.
FAN_DIGITS: Dict[str, Any] = dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0,
                                  num_classes=10)

default_cfgs = generate_default_cfgs({
    **{name: FAN_CFG for name in FAN_NAMES.values()},
    "fan_digits_patch4_32": FAN_DIGITS_CFG,
})


def _fan(size: str, **kwargs: Any) -> FanVisionTransformer:
    return create_fan(FanVisionTransformer, FAN_NAMES[size], **dict(FAN_SIZES[size], **kwargs))


@register_model
def fan_tiny_12_p16_224(pretrained: bool = False, **kwargs: Any) -> FanVisionTransformer:
    """FAN-ViT-tiny (192 x 12, 4 heads; about 7.3M parameters)."""
    return _fan("tiny", pretrained=pretrained, **kwargs)


@register_model
def fan_small_12_p16_224(pretrained: bool = False, **kwargs: Any) -> FanVisionTransformer:
    """FAN-ViT-small (384 x 12, 8 heads)."""
    return _fan("small", pretrained=pretrained, **kwargs)


@register_model
def fan_base_18_p16_224(pretrained: bool = False, **kwargs: Any) -> FanVisionTransformer:
    """FAN-ViT-base (448 x 18, 8 heads)."""
    return _fan("base", pretrained=pretrained, **kwargs)


@register_model
def fan_large_24_p16_224(pretrained: bool = False, **kwargs: Any) -> FanVisionTransformer:
    """FAN-ViT-large (480 x 24, 10 heads)."""
    return _fan("large", pretrained=pretrained, **kwargs)


@register_model
def fan_digits_patch4_32(pretrained: bool = False, **kwargs: Any) -> FanVisionTransformer:
    """FAN at the embedded digits size (32x32, 4x4 conv stem, 4 blocks, width 64)."""
    return create_fan(FanVisionTransformer, "fan_digits_patch4_32", pretrained, **dict(FAN_DIGITS, **kwargs))


# --- zoo aliases -------------------------------------------------------------------------------
from .zoo import ModelEntry, zoo  # noqa: E402  (after the timm registrations above)

zoo.add("fan", ModelEntry(
    "fan", "FAN-ViT (Zhou et al. 2022): token-mixing attention + channel-attention MLP",
    archs={"digits": "fan_digits_patch4_32", "imagenet": "fan_tiny_12_p16_224"},
    default_checkpoints={"digits": "embedded:fan_digits"},
))
