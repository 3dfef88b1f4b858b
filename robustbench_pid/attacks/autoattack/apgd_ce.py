"""APGD-CE (Croce & Hein 2020): step-size-free PGD on the cross-entropy loss, L-inf.

The first attack of AutoAttack, as its own rung of the convergence ladder (``--converge``), run by
pyautoattack's ``APGDAttack`` (the authors' code) through ``_library``. Defaults are AutoAttack
standard's: 100 iterations, one restart, rho 0.75. ``apgd_ce_l2``: the same in the L2 threat
model. It only attacks points still classified correctly
and keeps a point as soon as it is misclassified at top-1 (the top-5 recorded under it is an upper
bound, not a worst case).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import attacks, register_l2
from ._library import quiet_logger, run_library
from ..base import LIBRARY_NORM, Attack, Bounds


@attacks.register("apgd_ce")
@dataclass
class APGDCE(Attack):
    name = "apgd_ce"
    norm = "linf"

    eps: float = 4 / 255
    steps: int = 100
    restarts: int = 1
    rho: float = 0.75

    label = "APGD-CE"
    loss = "ce"  # the library's loss name; a class constant, not a setting

    def describe(self) -> str:
        r = f", {self.restarts} restarts" if self.restarts != 1 else ""
        return f"{self.label}-{self.steps}{r}"

    def perturb(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bounds: Bounds,
                generator: torch.Generator) -> torch.Tensor:
        from pyautoattack.autopgd_base import APGDAttack

        def build(net: torch.nn.Module, eps: float, seed: int) -> APGDAttack:
            return APGDAttack(net, n_iter=self.steps, norm=LIBRARY_NORM[self.norm],
                              n_restarts=self.restarts, eps=eps, seed=seed,
                              loss=self.loss, rho=self.rho, device=x.device, logger=quiet_logger())

        return run_library(self, model, x, y, bounds, generator, build)


APGDCEL2 = register_l2(APGDCE, "apgd_ce_l2", "APGD-CE-L2")
