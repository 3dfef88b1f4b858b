"""Pretrained configs (timm style) for our registered models.

``url`` is empty on purpose: our weights never come from the network. ImageNet models take a
``--checkpoint``; the digits models load from the embedded checkpoints (``checkpoints/``).
"""
from __future__ import annotations

from typing import Any, Dict

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

IMAGENET_CFG: Dict[str, Any] = dict(
    url="",
    num_classes=1000,
    input_size=(3, 224, 224),
    pool_size=None,
    crop_pct=0.875,  # DeiT eval: Resize 256 bicubic, CenterCrop 224
    interpolation="bicubic",
    fixed_input_size=True,
    mean=IMAGENET_DEFAULT_MEAN,
    std=IMAGENET_DEFAULT_STD,
    first_conv="patch_embed.proj",
    classifier="head",
)

# Digits images are rescaled to [0, 1] then normalized with the usual 0.5/0.5 (mean/std of the
# train split are close to these; fixed values keep the config independent of the data).
DIGITS_CFG: Dict[str, Any] = dict(
    url="",
    num_classes=10,
    input_size=(3, 32, 32),
    pool_size=None,
    crop_pct=1.0,
    interpolation="bilinear",
    fixed_input_size=True,
    mean=(0.5, 0.5, 0.5),
    std=(0.5, 0.5, 0.5),
    first_conv="patch_embed.proj",
    classifier="head",
)
