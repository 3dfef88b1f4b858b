"""PGD, L-inf (Madry et al. 2018), with per-sample early stopping.

Defaults: 20 steps of 2.5 * eps / steps (Madry's rule: the walk can cross the ball 2.5 times),
random start uniform in the eps-ball, seeded by the runner. ``step_size`` overrides the step
(the ``paper`` protocol uses 0.15 * eps, as the authors' cleverhans call did).

Early stopping: a sample stops being attacked as soon as its label leaves the top-``stop_topk``
predictions, and its successful point is kept. Both reported verdicts (top-1 and top-5) are then
final, so accuracy is the same as attacking on, at a fraction of the cost once most samples
break. ``early_stop=False`` reproduces plain PGD that returns the last iterate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from . import attacks
from .base import Attack, Bounds, clip, descend, draw, project_linf


@attacks.register("pgd")
@dataclass
class PGD(Attack):
    name = "pgd"
    norm = "linf"

    eps: float = 3 / 255
    steps: int = 20
    step_size: Optional[float] = None  # default 2.5 * eps / steps
    step_size_factor: Optional[float] = None  # step = factor * eps (paper protocol: 0.15)
    random_start: bool = True
    early_stop: bool = True
    stop_topk: int = 5

    label = "PGD"
    paper_eps = 3 / 255

    def describe(self) -> str:
        if self.step_size is not None:
            step = f"step {self.step_size:g}"
        elif self.step_size_factor is not None:
            step = f"step {self.step_size_factor:g}·eps"
        else:
            step = f"step 2.5·eps/{max(1, self.steps)}"
        parts = [step, "random start" if self.random_start else "no random start",
                 f"early stop top-{self.stop_topk}" if self.early_stop else "last iterate"]
        return f"PGD-{self.steps} ({', '.join(parts)})"

    def step(self) -> float:
        if self.step_size is not None:
            return self.step_size
        if self.step_size_factor is not None:
            return self.step_size_factor * self.eps
        return 2.5 * self.eps / max(1, self.steps)

    def perturb(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bounds: Bounds,
                generator: torch.Generator) -> torch.Tensor:
        alpha = self.step()
        x_adv = x.clone()
        if self.random_start:
            noise = draw("rand", x.shape, generator, x.device, x.dtype)
            x_adv = clip(x + (2 * noise - 1) * self.eps, bounds)
        return descend(self, model, x, y, x_adv, self.steps,
                       lambda xa, xo, g: project_linf(xa + alpha * g.sign(), xo, self.eps, bounds),
                       self.early_stop, self.stop_topk)
