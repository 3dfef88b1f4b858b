"""APGD-T (Croce & Hein 2020): APGD on the targeted DLR loss, one run per target class, L-inf.

AutoAttack's second attack, as a rung of the convergence ladder. The DLR loss divides the margin by
the spread of the top logits, so it is unchanged when the logits are shifted or scaled: a model whose
logits are multiplied by 1e4 saturates cross-entropy (zero gradients) but not this loss. Run by
pyautoattack's ``APGDAttack_targeted``; defaults as AutoAttack standard: 9 targets (the classes with
the highest logits after the true one; fewer when the model has fewer classes), 100 iterations each.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

from .. import attacks, register_l2
from ._library import n_targets, need_classes, quiet_logger, run_library
from ..base import LIBRARY_NORM, Attack, Bounds


@attacks.register("apgd_t")
@dataclass
class APGDT(Attack):
    name = "apgd_t"
    norm = "linf"
    loss_kind = "margin"

    eps: float = 4 / 255
    steps: int = 100
    restarts: int = 1
    targets: int = 9
    rho: float = 0.75

    label = "APGD-T"

    def describe(self) -> str:
        r = f", {self.restarts} restarts" if self.restarts != 1 else ""
        return f"{self.label}-{self.steps} ({self.targets} targets{r})"

    def passes(self) -> Tuple[float, float]:
        """One gradient pass per iteration, target and restart (the worst case, no early stop)."""
        return 0.0, float(self.steps * self.targets * max(1, self.restarts))

    def perturb(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bounds: Bounds,
                generator: torch.Generator) -> torch.Tensor:
        from pyautoattack.autopgd_base import APGDAttack_targeted

        k = n_targets(self.targets, need_classes(self, model, x, 4, "'apgd_t'"), "'apgd_t'")

        def build(net: torch.nn.Module, eps: float, seed: int) -> APGDAttack_targeted:
            return APGDAttack_targeted(net, n_iter=self.steps, norm=LIBRARY_NORM[self.norm],
                                       n_restarts=self.restarts, eps=eps,
                                       seed=seed, rho=self.rho, n_target_classes=k, device=x.device,
                                       logger=quiet_logger())

        return run_library(self, model, x, y, bounds, generator, build)


APGDTL2 = register_l2(APGDT, "apgd_t_l2", "APGD-T-L2")
