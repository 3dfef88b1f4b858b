"""FGSM (Goodfellow et al. 2015): one signed-gradient step of size eps, L-inf."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import attacks
from .base import Attack, Bounds, clip


@attacks.register("fgsm")
@dataclass
class FGSM(Attack):
    name = "fgsm"
    norm = "linf"

    eps: float = 3 / 255

    label = "FGSM"
    paper_eps = 3 / 255

    def describe(self) -> str:
        return "FGSM"

    def perturb(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bounds: Bounds,
                generator: torch.Generator) -> torch.Tensor:
        grad, _ = self.input_grad(model, x, y)
        return clip(x + self.eps * grad.sign(), bounds)
