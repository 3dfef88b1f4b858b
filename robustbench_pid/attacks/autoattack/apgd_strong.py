"""APGD with a larger budget: more restarts and iterations, for samples an attack may have under-solved.

Carlini et al. (2019): if doubling iterations and restarts changes the result, the first number was
not converged. The convergence ladder runs this rung on the samples the incomplete-optimisation
indicator flags (loss still rising at the last iterate) and, at the end of the ladder, on every
sample still robust when the ladder has not converged yet. Defaults: 5 restarts of 250 iterations
(AutoAttack's APGD-CE runs one of 100; the ladder's default is 5 x 100, ``strong_steps``) on the CE
loss; ``loss = "dlr"`` uses the scale-invariant DLR loss instead. Run by pyautoattack's ``APGDAttack``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import attacks
from ._library import need_classes, quiet_logger, run_library
from ..base import Attack, Bounds


@attacks.register("apgd_strong")
@dataclass
class APGDStrong(Attack):
    name = "apgd_strong"
    norm = "linf"

    eps: float = 4 / 255
    steps: int = 250
    restarts: int = 5
    loss: str = "ce"

    label = "APGD-strong"

    def describe(self) -> str:
        return f"APGD-{self.loss.upper()}-{self.steps} ({self.restarts} restarts)"

    def validate(self, loc: str = "") -> None:
        super().validate(loc)
        from ...errors import UserError

        if self.loss not in ("ce", "dlr"):
            raise UserError(f"{loc}attack 'apgd_strong': loss must be 'ce' or 'dlr', got {self.loss!r}")

    def perturb(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bounds: Bounds,
                generator: torch.Generator) -> torch.Tensor:
        from pyautoattack.autopgd_base import APGDAttack

        def build(net: torch.nn.Module, eps: float, seed: int) -> APGDAttack:
            return APGDAttack(net, n_iter=self.steps, norm="Linf", n_restarts=self.restarts, eps=eps, seed=seed,
                              loss=self.loss, device=x.device, logger=quiet_logger())

        if self.loss == "dlr":
            need_classes(self, model, x, 3, "'apgd_strong' with loss 'dlr'")
        return run_library(self, model, x, y, bounds, generator, build)
