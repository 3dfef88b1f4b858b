"""PGD, L2 (Madry et al. 2018), with the same early stopping as the L-inf PGD.

Step: ``x + alpha * g / |g|_2``, then projection onto the L2 ball of radius eps (a rescale, which is
the exact Euclidean projection for L2) and clipping. Defaults: eps 0.5 (pixel units; not bounded
by 1), 20 steps of 2.5 * eps / steps, random start uniform in the ball, seeded by the runner.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from . import attacks
from .base import Attack, Bounds, clip, descend, draw


def project_l2(delta: torch.Tensor, eps: float) -> torch.Tensor:
    norms = delta.flatten(1).norm(dim=1).clamp_min(1e-12)
    factor = (eps / norms).clamp(max=1.0)
    return delta * factor.view(-1, *([1] * (delta.dim() - 1)))


@attacks.register("pgd_l2")
@dataclass
class PGDL2(Attack):
    name = "pgd_l2"
    norm = "l2"
    eps_max = float("inf")

    eps: float = 0.5
    steps: int = 20
    step_size: Optional[float] = None  # default 2.5 * eps / steps
    random_start: bool = True
    early_stop: bool = True
    stop_topk: int = 5

    label = "PGD-L2"

    def describe(self) -> str:
        step = f"step {self.step_size:g}" if self.step_size is not None else f"step 2.5·eps/{max(1, self.steps)}"
        parts = [step, "random start" if self.random_start else "no random start",
                 f"early stop top-{self.stop_topk}" if self.early_stop else "last iterate"]
        return f"PGD-L2-{self.steps} ({', '.join(parts)})"

    def perturb(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bounds: Bounds,
                generator: torch.Generator) -> torch.Tensor:
        alpha = self.step_size if self.step_size is not None else 2.5 * self.eps / max(1, self.steps)
        view = (-1,) + (1,) * (x.dim() - 1)
        x_adv = x.clone()
        if self.random_start:  # uniform in the ball: Gaussian direction, radius eps * U^(1/d)
            d = draw("randn", x.shape, generator, x.device, x.dtype)
            d = d / d.flatten(1).norm(dim=1).clamp_min(1e-12).view(view)
            r = draw("rand", (len(x),), generator, x.device, x.dtype) ** (1.0 / x[0].numel())
            x_adv = clip(x + d * (self.eps * r).view(view), bounds)

        def update(xa: torch.Tensor, xo: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
            g = g / g.flatten(1).norm(dim=1).clamp_min(1e-12).view(view)
            return clip(xo + project_l2(xa + alpha * g - xo, self.eps), bounds)

        return descend(self, model, x, y, x_adv, self.steps, update, self.early_stop, self.stop_topk)
