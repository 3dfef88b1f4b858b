"""Square attack, L-inf (Andriushchenko et al. 2020): score-based black box, random search over
square-shaped updates at the corners of the eps-ball, margin loss.

Uses the reference implementation shipped in ``pyautoattack`` (the AutoAttack authors' code, the
same Square that runs inside AutoAttack) rather than a re-write: its margin masks the true class
with ``-inf`` (right for negative logits), it only queries points still classified correctly, and
stops a point as soon as it is fooled. Wrapped so that:
- its seed comes from the runner's generator, and the global torch RNG it reseeds is restored
  afterwards (``torch.random.fork_rng``), so it neither ignores nor disturbs the run's seeding;
- the ``paper`` protocol (no box) is handled exactly by an affine map into [0, 1] (see ``_box``).

Defaults as in AutoAttack's standard version: 5,000 queries, p_init 0.8, one restart, no
schedule rescaling. Only top-1 is attacked (the reported top-5 under Square is an upper bound).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

from . import attacks
from ._box import to_unit_box
from .base import Attack, Bounds, dlr_losses, project_linf
from .telemetry import Counted


def seed_from(generator: torch.Generator) -> int:
    """A seed for a library that insists on global seeding, drawn from our generator."""
    return int(torch.randint(0, 2 ** 31 - 1, (1,), generator=generator, device=generator.device).item())


def rng_devices(x: torch.Tensor) -> list:
    return [x.device.index or 0] if x.device.type == "cuda" else []


@attacks.register("square")
@dataclass
class Square(Attack):
    name = "square"
    norm = "linf"
    uses_gradients = False
    loss_kind = "margin"

    eps: float = 4 / 255
    n_queries: int = 5000
    p_init: float = 0.8
    restarts: int = 1
    rescale_schedule: bool = False

    label = "Square"

    def passes(self) -> Tuple[float, float]:
        """One forward pass per query and restart."""
        return float(self.n_queries * max(1, self.restarts)), 0.0

    def describe(self) -> str:
        parts = [f"p_init {self.p_init:g}", f"{self.restarts} restart{'s' if self.restarts != 1 else ''}"]
        parts += ["rescaled schedule"] if self.rescale_schedule else []
        return f"Square-{self.n_queries} ({', '.join(parts)})"

    def validate(self, loc: str = "") -> None:
        super().validate(loc)
        from ..errors import UserError

        if not (0 < self.p_init <= 1) or self.n_queries < 1 or self.restarts < 1:
            raise UserError(f"{loc}attack 'square': need 0 < p_init <= 1, n_queries >= 1, restarts >= 1")

    @torch.no_grad()
    def perturb(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bounds: Bounds,
                generator: torch.Generator) -> torch.Tensor:
        from pyautoattack.square import SquareAttack

        seed = seed_from(generator)
        counted = Counted(model, x, labels=y, eps=self.eps)
        model, x_in, eps, back = to_unit_box(counted, x, self.eps, bounds)
        class Tracked(SquareAttack):
            """The library's Square, keeping each run's best point of every sample it attacked (perturb returns
            the clean image for a sample it did not fool)."""
            runs: list = []

            def attack_single_run(self, xs, ys):
                n, best = super().attack_single_run(xs, ys)
                self.runs.append(best)
                return n, best

        sq = Tracked(model, norm="Linf", n_queries=self.n_queries, eps=eps, p_init=self.p_init,
                     n_restarts=self.restarts, seed=seed, verbose=False, loss="margin",
                     resc_schedule=self.rescale_schedule, device=x.device)
        sq.runs = []
        with torch.random.fork_rng(devices=rng_devices(x)):
            u_adv = sq.perturb(x_in, y)
            self.stats["best_loss"] = self._nearness(model, x_in, u_adv, y, sq.runs)
            counted.settle(self.telemetry)  # per sample: each forwarded row charged to its nearest clean image
        self.stats.update(counted.progress() or {})  # the search's progress per sample (the ladder's stop rule)
        # undo the affine map, then remove its float rounding (~1e-8) so the ball holds exactly
        return project_linf(back(u_adv), x, self.eps, bounds)

    @staticmethod
    def _nearness(model: torch.nn.Module, x_in: torch.Tensor, u_adv: torch.Tensor, y: torch.Tensor,
                  runs: list) -> torch.Tensor:
        """Per sample, the DLR loss (scale-free, > 0 once fooled) at the best point the first run reached: how near
        the boundary the search came, which a convergence ladder ranks samples by for its later rounds (gradient
        attacks fooled by the model say nothing about that). Two forward passes per sample."""
        loss = dlr_losses(model(u_adv), y)
        if runs:
            attacked = (model(x_in).argmax(1) == y).nonzero().squeeze(1)  # the library attacks these, in order
            best = runs[0]
            if len(best) == len(attacked):
                loss[attacked] = torch.maximum(loss[attacked], dlr_losses(model(best), y[attacked]))
        return loss
