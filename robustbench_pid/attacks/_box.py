"""Run a [0, 1]-box attack (pyautoattack's) on any box, or on unbounded inputs, exactly.

pyautoattack clamps every iterate to [0, 1]. A box ``[lo, hi]`` maps onto it affinely. The ``paper``
protocol has no box (normalized tensors, no clipping), so there we map the batch into the box by
``u = 0.5 + z / (2 R)`` with ``R = max|z| + eps`` for the whole batch; the model becomes
``net(2 R (u - 0.5))`` and the L-inf radius ``eps / (2 R)``. The eps-ball around every ``u`` then
lies inside [0, 1], so the clamp never binds: the attack solves the unclipped problem, uniformly
rescaled (an L-inf ball stays an L-inf ball under a uniform scaling).
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

Bounds = Optional[Tuple[float, float]]


class _Affine(torch.nn.Module):
    """``net(offset + scale * u)``."""

    def __init__(self, net: torch.nn.Module, offset: float, scale: float) -> None:
        super().__init__()
        self.net, self.offset, self.scale = net, offset, scale

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.net(self.offset + self.scale * u)


def to_unit_box(model: torch.nn.Module, x: torch.Tensor, eps: float, bounds: Bounds
                ) -> Tuple[torch.nn.Module, torch.Tensor, float, Callable[[torch.Tensor], torch.Tensor]]:
    """(model on u, u in [0, 1], L-inf eps in u units, map from u back to x's space)."""
    if bounds is None:
        scale = 2.0 * (float(x.abs().max()) + eps)
        offset = -scale / 2
    else:
        offset, scale = float(bounds[0]), float(bounds[1] - bounds[0])
    if offset == 0.0 and scale == 1.0:
        return model, x, eps, lambda u: u
    return (_Affine(model, offset, scale), (x - offset) / scale, eps / scale,
            lambda u: offset + scale * u)
