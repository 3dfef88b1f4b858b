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

from .. import attacks, register_l2
from ._library import classes_of, n_targets, run_library
from ..base import LIBRARY_NORM, Attack, Bounds


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
    first: int = 1  # the first target, by logit rank (1: the highest logit besides the true one)

    label = "FAB-T"

    def describe(self) -> str:
        if self.first == 1:
            return f"{self.label}-{self.steps} ({self.targets} target{'s' if self.targets != 1 else ''})"
        last = self.first + self.targets - 1
        return f"{self.label}-{self.steps} (targets {self.first}-{last} by logit)" if last > self.first else \
            f"{self.label}-{self.steps} (target {self.first} by logit)"

    def validate(self, loc: str = "") -> None:
        super().validate(loc)
        from ...errors import UserError

        if self.first < 1 or self.targets < 1:
            raise UserError(f"{loc}attack 'fab_t': first and targets must be >= 1, got first={self.first}, "
                            f"targets={self.targets}")

    def passes(self) -> Tuple[float, float]:
        """Per iteration and target: one Jacobian pass (forward+backward) of the two classes used."""
        return float(self.steps * self.targets * max(1, self.restarts)), float(self.steps * self.targets *
                                                                               max(1, self.restarts))

    def perturb(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bounds: Bounds,
                generator: torch.Generator) -> torch.Tensor:
        from pyautoattack.fab_pt import FABAttack_PT

        n_cls = classes_of(self, model, x)
        if self.first > 1 and self.first > n_cls - 1:
            return x.clone()  # no such target: nothing to attack (a ladder's later round on a tiny class set)
        k = n_targets(self.targets, n_cls - (self.first - 1), "'fab_t'")

        def build(net: torch.nn.Module, eps: float, seed: int) -> FABAttack_PT:
            return FABAttack_PT(net, norm=LIBRARY_NORM[self.norm],
                                n_restarts=self.restarts, n_iter=self.steps, eps=eps, seed=seed,
                                targeted=True, n_target_classes=k, device=x.device)

        first = self.first

        def later_targets(obj: FABAttack_PT, u: torch.Tensor, yy: torch.Tensor) -> torch.Tensor:
            """The library's targeted loop over target ranks first+1 .. first+k (its own starts at rank 2)."""
            adv = u.clone()
            with torch.no_grad():
                acc = obj._predict_fn(u).max(1)[1] == yy
                torch.random.manual_seed(obj.seed)
                for tc in range(first + 1, first + k + 1):
                    obj.target_class = tc
                    for counter in range(obj.n_restarts):
                        idx = acc.nonzero().squeeze(1)
                        if not idx.numel():
                            break
                        adv_c = obj.attack_single_run(u[idx], yy[idx], use_rand_start=counter > 0, is_targeted=True)
                        ok = obj._predict_fn(adv_c).max(1)[1] == yy[idx]
                        gap = (u[idx] - adv_c).reshape(len(idx), -1)
                        ok |= (gap.abs().max(1)[0] if obj.norm == "Linf" else gap.norm(dim=1)) > obj.eps
                        hit = (~ok).nonzero().squeeze(1)
                        acc[idx[hit]] = False
                        adv[idx[hit]] = adv_c[hit]
            return adv

        return run_library(self, model, x, y, bounds, generator, build, None if first == 1 else later_targets)


FABTL2 = register_l2(FABT, "fab_t_l2", "FAB-T-L2")
