"""Models whose forward pass is another model's and whose input gradient is not: ground truth for an evaluation.

Why these exist: a robustness evaluation that trusts gradients must be checked on models whose gradients mislead,
and the plain model behind the wrapper is the ground truth (the same function: whatever breaks the plain model
breaks these, and nothing else does). The convergence ladder's gradient trust is tested on them, and
``scripts/probe_step.py`` measures its probe with them; a user can wrap their own model the same way to see whether
an evaluation notices.
- :class:`SignFlipped`: the input gradient negated (finite and non-zero: not "unavailable");
- :class:`NoisyGradient`: ``g + scale * ||g|| * u``, ``u`` a random unit direction per sample drawn afresh at every
  backward pass from the wrapper's own seeded generator (repeatable; "mostly noise" at scale 3).
"""
from __future__ import annotations

from typing import Any, Tuple

import torch


class _Flip(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return -g


class _Noise(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, gen: torch.Generator, scale: float) -> torch.Tensor:  # type: ignore[override]
        ctx.gen, ctx.scale = gen, scale
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Tuple[torch.Tensor, None, None]:  # type: ignore[override]
        u = torch.randn(g.shape, generator=ctx.gen).to(g).flatten(1)
        u = u / u.norm(dim=1, keepdim=True)
        return g + ctx.scale * (g.flatten(1).norm(dim=1, keepdim=True) * u).view_as(g), None, None


class SignFlipped(torch.nn.Module):
    """``net``'s forward pass; its input gradient is negated, so every gradient attack walks away from the boundary
    while a gradient-free search is not misled."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(_Flip.apply(x))


class NoisyGradient(SignFlipped):
    """``net``'s forward pass; its input gradient is mostly noise: g + ``scale`` ||g|| u (see the module docstring)."""

    def __init__(self, net: torch.nn.Module, scale: float = 3.0, seed: int = 0) -> None:
        super().__init__(net)
        self.scale = float(scale)
        self.gen = torch.Generator().manual_seed(seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(_Noise.apply(x, self.gen, self.scale))
