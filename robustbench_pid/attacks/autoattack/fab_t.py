"""FAB-T (Croce & Hein 2020): targeted fast adaptive boundary attack, L-inf.

AutoAttack's third attack, as a rung of the convergence ladder: it walks to the nearest decision
boundary of each target class by linearising the model, a different search from APGD's ascent, so it
finds points APGD misses near flat or noisy losses. Run by pyautoattack's ``FABAttack_PT`` (targeted);
defaults as AutoAttack standard: 9 targets (fewer with fewer classes), 100 iterations, one restart.
A point FAB finds outside the eps-ball does not count (the library keeps x there).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

from .. import attacks
from ._library import classes_of, n_targets, run_library
from ..base import Attack, Bounds


@attacks.register("fab_t")
@dataclass
class FABT(Attack):
    name = "fab_t"
    norm = "linf"
    loss_kind = "margin"

    eps: float = 4 / 255
    steps: int = 100
    restarts: int = 1
    targets: int = 9

    label = "FAB-T"

    def describe(self) -> str:
        return f"{self.label}-{self.steps} ({self.targets} targets)"

    def passes(self) -> Tuple[float, float]:
        """Per iteration and target: one Jacobian pass (forward+backward) of the two classes used."""
        return float(self.steps * self.targets * max(1, self.restarts)), float(self.steps * self.targets *
                                                                               max(1, self.restarts))

    def perturb(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bounds: Bounds,
                generator: torch.Generator) -> torch.Tensor:
        from pyautoattack.fab_pt import FABAttack_PT

        k = n_targets(self.targets, classes_of(self, model, x), "'fab_t'")

        def build(net: torch.nn.Module, eps: float, seed: int) -> FABAttack_PT:
            return FABAttack_PT(net, norm="Linf", n_restarts=self.restarts, n_iter=self.steps, eps=eps, seed=seed,
                                targeted=True, n_target_classes=k, device=x.device)

        return run_library(self, model, x, y, bounds, generator, build)
