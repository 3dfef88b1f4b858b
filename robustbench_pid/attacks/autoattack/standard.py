"""AutoAttack, standard version (Croce & Hein 2020), L-inf, via the reference implementation
published on PyPI as ``pyautoattack`` (the authors' code): APGD-CE (100 iterations), APGD-T (9 target
classes, 100 iterations each), FAB-T (9 targets) and Square (5,000 queries), each run only on the
points still robust after the previous ones.

``torchattacks.AutoAttack`` is not used: it runs 10-step APGD and n_classes-1 targets, i.e. it is
not the published AutoAttack and its numbers must not be reported as such.

Wrapping, so that AutoAttack fits the harness:
- its seed is drawn from the runner's generator (``pyautoattack`` otherwise seeds with the clock),
  and the global torch RNG it reseeds is restored afterwards (``torch.random.fork_rng``);
- the benchmark already hands it only clean-correct samples, and AutoAttack itself attacks only
  points it finds robust; it returns ``x`` for points it could not break;
- the ``paper`` protocol (no box) is handled exactly by an affine map into [0, 1] (see ``_box``);
- it attacks top-1 only: the top-5 recorded under AutoAttack is an upper bound, not a worst case.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Tuple

import torch

from .. import attacks, register_l2
from .._box import to_unit_box
from ..base import LIBRARY_NORM, Attack, Bounds, project_ball
from ..telemetry import Counted
from ..square import rng_devices, seed_from


@attacks.register("autoattack")
@dataclass
class AutoAttack(Attack):
    name = "autoattack"
    norm = "linf"

    eps: float = 4 / 255
    version: str = "standard"

    label = "AutoAttack"

    def passes(self) -> Tuple[float, float]:
        """Standard AutoAttack: APGD-CE 100 + APGD-T 9 x 100 + FAB-T 9 x 100 steps, Square 5000 queries."""
        return 5000.0, float(100 + 900 + 900)

    def describe(self) -> str:
        return f"AutoAttack ({self.version})"

    def validate(self, loc: str = "") -> None:
        super().validate(loc)
        from ...errors import UserError

        if self.version != "standard":
            raise UserError(f"{loc}attack 'autoattack': version must be 'standard' (the only one reported "
                            f"as AutoAttack), got {self.version!r}")

    def perturb(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bounds: Bounds,
                generator: torch.Generator) -> torch.Tensor:
        from pyautoattack import AutoAttack as _AA

        seed = seed_from(generator)
        counted = Counted(model, x)
        model, x_in, eps, back = to_unit_box(counted, x, self.eps, bounds)
        aa = _AA(model, norm=LIBRARY_NORM[self.norm], eps=eps, version="standard", seed=seed, device=x.device)
        log = logging.getLogger("auto-attack")
        level = log.level
        log.setLevel(logging.ERROR)  # its range/randomness checks are informational here
        try:
            with torch.random.fork_rng(devices=rng_devices(x)):
                u_adv, _ = aa.run_standard_evaluation(x_in, y, batch_size=max(1, len(x)))
                counted.settle(self.telemetry)  # per sample: each forwarded row charged to its nearest clean image
        finally:
            log.setLevel(level)
        # undo the affine map, then remove its float rounding (~1e-8) so the ball holds exactly
        return project_ball(back(u_adv), x, self.eps, bounds, self.norm)


def _describe_l2(self: AutoAttack) -> str:
    return f"AutoAttack L2 ({self.version})"


AutoAttackL2 = register_l2(AutoAttack, "autoattack_l2", "AutoAttack-L2",
                           "AutoAttack standard in the L2 threat model (the library's ``norm='L2'``: the same four "
                           "attacks in their L2 forms; RobustBench's CIFAR-10 L2 leaderboard is this at eps 0.5).",
                           describe=_describe_l2)
