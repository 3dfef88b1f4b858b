"""Models take images in [0, 1]; normalization lives inside the wrapped model.

Keeping it inside means every attack works in pixel space by default (the ``standard`` protocol),
and the ``paper`` protocol can still reach the un-normalized network through ``.net``.
"""
from __future__ import annotations

from typing import Any, Dict, Sequence

import torch
from torch import nn


class Normalized(nn.Module):
    """``net((x - mean) / std)`` for ``x`` in [0, 1]."""

    def __init__(self, net: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))
        self.info: Dict[str, Any] = {}  # provenance filled by load_model

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        return z * self.std + self.mean

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.normalize(x))

    @property
    def num_classes(self) -> int:
        return int(getattr(self.net, "num_classes"))
