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

``resume`` (set on the object, not a setting; L-inf only) continues earlier runs instead of starting afresh:
per sample the sign pattern of its best point (L-inf Square's points are always ``clip(x + eps * s)`` with
``s`` in {-1, 0, +1} per pixel, so the pattern restores the point exactly) and the queries it had done; the run
starts at that point with the square-size schedule where it left off. Split into pieces like this, Square is
AutoAttack's one long run paused between pieces (a convergence ladder decides between them where to go on),
not a sum of fresh restarts that each repeat the large early squares. ``stats["signs"]`` and
``stats["done"]`` give the state to resume from.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

import torch

from . import attacks, register_l2
from ._box import to_unit_box
from .base import LIBRARY_NORM, Attack, Bounds, dlr_losses, project_ball
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

    # per sample of the next call: (sign pattern of its best point, int8 like x; queries done), or None
    resume: Optional[Tuple[torch.Tensor, torch.Tensor]] = field(default=None, init=False, repr=False,
                                                                compare=False)

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
        counted = Counted(model, x, labels=y, eps=self.eps, norm=self.norm)
        model, x_in, eps, back = to_unit_box(counted, x, self.eps, bounds)
        clean = model(x_in).float()
        attacked = (clean.argmax(1) == y).nonzero().squeeze(1)  # the library attacks these, in order
        signs, done = self.resume if self.resume is not None else (None, None)
        start = int(done[attacked].min()) if done is not None and len(attacked) else 0

        class Tracked(SquareAttack):
            """The library's Square, keeping each run's best point of every sample it attacked (perturb returns
            the clean image for a sample it did not fool), and, to resume, starting from given points with the
            schedule moved on by the queries already done."""
            runs: list = []
            init: Optional[torch.Tensor] = None

            def attack_single_run(self, xs, ys):
                n, best = super().attack_single_run(xs, ys)
                self.runs.append(best)
                self.predict.expect = True  # the library's next pass checks this run's best points
                return n, best

            def random_choice(self, shape):
                init, self.init = self.init, None  # only the run's first draw is the starting point
                if init is not None and list(shape) == [len(init), init.shape[1], 1, init.shape[3]]:
                    return init
                return super().random_choice(shape)

            def p_selection(self, it):
                return super().p_selection(it + start)

        if signs is not None and (self.restarts != 1 or self.norm != "linf"):
            raise ValueError("square: resume continues one L-inf run; it needs restarts = 1 and norm linf")
        sq = Tracked(model, norm=LIBRARY_NORM[self.norm], n_queries=self.n_queries, eps=eps, p_init=self.p_init,
                     n_restarts=self.restarts, seed=seed, verbose=False, loss="margin",
                     resc_schedule=self.rescale_schedule, device=x.device)
        sq.runs = []
        sq.predict = seen = _Passes(model, x_in, clean)
        if signs is not None and len(attacked):
            sq.init = signs[attacked].to(x.device, x_in.dtype)
        with torch.random.fork_rng(devices=rng_devices(x)):
            u_adv = sq.perturb(x_in, y)
            self.stats["best_loss"] = self._nearness(clean, y, attacked, seen.checked)
            counted.settle(self.telemetry)  # per sample: each forwarded row charged to its nearest clean image
        self.stats.update(counted.progress() or {})  # the search's progress per sample (the ladder's stop rule)
        if self.norm != "linf":  # an L2 point is no sign pattern: its later runs start afresh
            return project_ball(back(u_adv), x, self.eps, bounds, self.norm)
        self.stats["signs"] = torch.zeros(x_in.shape, dtype=torch.int8, device=x.device)
        before = torch.zeros(len(x)) if done is None else done.float()
        self.stats["done"] = before.to(x.device).clone()
        if sq.runs and len(sq.runs[0]) == len(attacked):
            self.stats["signs"][attacked] = torch.sign(sq.runs[0] - x_in[attacked]).to(torch.int8)
            self.stats["done"][attacked] += float(self.n_queries)
        # undo the affine map, then remove its float rounding (~1e-8) so the ball holds exactly
        return project_ball(back(u_adv), x, self.eps, bounds, self.norm)

    @staticmethod
    def _nearness(clean: torch.Tensor, y: torch.Tensor, attacked: torch.Tensor, checked: list) -> torch.Tensor:
        """Per sample, the DLR loss (scale-free, > 0 once fooled) at the best point the first run reached (the clean
        point where it attacked none): how near the boundary the search came, which a convergence ladder ranks
        samples by for its later rounds (gradient attacks fooled by the model say nothing about that). From passes
        the library made anyway (design 8: two passes of their own before): its check of the run's best points,
        and the clean logits the attacked samples were chosen by."""
        loss = dlr_losses(clean, y)
        if checked and len(checked[0]) == len(attacked) and len(attacked):
            loss[attacked] = torch.maximum(loss[attacked], dlr_losses(checked[0], y[attacked]))
        return loss


class _Passes(torch.nn.Module):
    """The model as the library's Square calls it in one call of :meth:`Square.perturb`: its first pass (the clean
    check of the very tensor it was given) answered with the logits the wrapper computed of it, and the pass that
    follows each run (the library's check of the run's best points) kept (:attr:`checked`) for the nearness."""

    def __init__(self, net: torch.nn.Module, x: torch.Tensor, logits: torch.Tensor) -> None:
        super().__init__()
        self.net, self.x, self.logits = net, x, logits
        self.expect = False
        self.checked: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.logits is not None and x is self.x:
            out, self.logits = self.logits, None
            return out
        self.logits = None
        out = self.net(x)
        if self.expect:
            self.checked.append(out.detach().float())
            self.expect = False
        return out


def _describe_l2(self: Square) -> str:
    return Square.describe(self).replace("Square-", "Square-L2-", 1)


SquareL2 = register_l2(Square, "square_l2", "Square-L2", "Square in the L2 threat model (the library's L2 form: "
                       "square-shaped updates of the L2 perturbation).", describe=_describe_l2)
