"""Uniform L-inf noise (the papers' "noise" row; cleverhans ``noise``): ``x + U(-eps, eps)``.

Not a worst case: the sample's own clean verdict is not folded in (``worst_case = False``), the
score is plain accuracy on the noisy images. The noise is drawn from the runner's generator.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import attacks
from .base import Attack, Bounds, clip, draw


@attacks.register("noise")
@dataclass
class Noise(Attack):
    name = "noise"
    norm = "linf"
    uses_gradients = False
    worst_case = False

    eps: float = 0.3  # cleverhans' default, as the papers ran it

    label = "Noise"
    paper_eps = 0.3

    def describe(self) -> str:
        return "Noise (uniform in the eps-ball)"

    def perturb(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bounds: Bounds,
                generator: torch.Generator) -> torch.Tensor:
        u = draw("rand", x.shape, generator, x.device, x.dtype)
        return clip(x + (2 * u - 1) * self.eps, bounds)
