"""APGD with expectation over transformation (EOT), for randomised models, L-inf.

AutoAttack's ``rand`` version attacks a model whose forward pass is random (dropout left on, random
input transforms) with APGD whose gradient is averaged over ``eot_iter`` draws (20), on the CE and on
the DLR loss: one draw's gradient is noise, the average points where the expected loss rises. The
convergence ladder adds this rung on its own when repeated clean forward passes disagree. Run by
pyautoattack's ``APGDAttack`` with its ``eot_iter`` setting.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

from .. import attacks, register_l2
from ._library import need_classes, quiet_logger, run_library
from ..base import LIBRARY_NORM, Attack, Bounds


@attacks.register("apgd_eot")
@dataclass
class APGDEOT(Attack):
    name = "apgd_eot"
    norm = "linf"

    eps: float = 4 / 255
    steps: int = 100
    eot_iter: int = 20
    loss: str = "ce"
    restarts: int = 1

    label = "APGD-EOT"

    @property
    def loss_kind(self) -> str:  # type: ignore[override]
        return "ce" if self.loss == "ce" else "margin"

    def describe(self) -> str:
        return f"APGD-{self.loss.upper()}-{self.steps} (EOT over {self.eot_iter} draws)"

    def validate(self, loc: str = "") -> None:
        super().validate(loc)
        from ...errors import UserError

        if self.loss not in ("ce", "dlr"):
            raise UserError(f"{loc}attack 'apgd_eot': loss must be 'ce' or 'dlr', got {self.loss!r}")
        if self.eot_iter < 1:
            raise UserError(f"{loc}attack 'apgd_eot': eot_iter must be >= 1, got {self.eot_iter}")

    def passes(self) -> Tuple[float, float]:
        """eot_iter gradient passes per iteration and restart, and for the starting point (the library averages
        eot_iter gradients there too), plus the clean check's forward pass (measured: steps 10, eot_iter 4 made 44
        gradient passes and 1 forward-only pass per sample)."""
        return 1.0, float((self.steps + 1) * self.eot_iter * max(1, self.restarts))

    def perturb(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bounds: Bounds,
                generator: torch.Generator) -> torch.Tensor:
        from pyautoattack.autopgd_base import APGDAttack

        def build(net: torch.nn.Module, eps: float, seed: int) -> APGDAttack:
            return APGDAttack(net, n_iter=self.steps, norm=LIBRARY_NORM[self.norm],
                              n_restarts=self.restarts, eps=eps, seed=seed,
                              loss=self.loss, eot_iter=self.eot_iter, device=x.device, logger=quiet_logger())

        if self.loss == "dlr":
            need_classes(self, model, x, 3, "'apgd_eot' with loss 'dlr'")
        return run_library(self, model, x, y, bounds, generator, build)


APGDEOTL2 = register_l2(APGDEOT, "apgd_eot_l2", "APGD-EOT-L2")
