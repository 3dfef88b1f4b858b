"""APGD-T with its targets ranked by an estimate of the distance to each class boundary, L-inf.

AutoAttack's APGD-T attacks the 9 classes with the highest logits after the true one, each for 100
iterations, so on a robust sample it spends 900 gradient passes. The class whose boundary is nearest in
the threat model's norm is usually among the first two or three of a better ranking: the linearised
distance to the boundary between y and t, ``(z_y - z_t) / ||grad_x (z_y - z_t)||_1`` (the L1 norm is the
dual of L-inf), which is the targeting idea of MALT (Melamed et al., NeurIPS 2024). Ranking costs one
forward and ``pool`` backward passes per sample (one per candidate class, candidates = the ``pool``
highest logits besides the true one), charged to the telemetry like the attack's own passes.

``first`` picks where in the ranking the attack starts (1 = the nearest boundary), so a ladder can give
the next ranked targets to a later round. Each target gets one APGD run of ``steps`` iterations of
pyautoattack's ``APGDAttack_targeted`` (the authors' code: the targeted DLR loss, its step-size rule
and checkpoints), only on the samples no earlier target broke. ``stats["best_loss"]`` keeps, per sample, the
untargeted DLR loss (scale-free; > 0 once broken) at the best point of its best target: how near the boundary it
came, on the scale Square's nearness uses (read from the logits the run computed: no pass of its own), so a convergence ladder can
compare the two families' evidence, and ``stats["target_order"]`` / ``stats["target_reach"]`` keep the classes in the
order attacked and that nearness per class (-inf: not attacked), so a ladder can give its deep runs the classes a
short sweep actually came nearest on. ``order`` (set on the object, not a setting) replaces the ranking with one
given per sample: the classes the caller measured nearest first (no ranking passes are spent then); a -1 in it
skips that position for that sample (a ladder giving one sample a single class where others get three).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

import torch

from .. import attacks, register_l2
from ._library import need_classes, quiet_logger, run_library
from ..base import LIBRARY_NORM, Attack, Bounds, dlr_losses


def rank_targets(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, pool: int, norm: str = "linf"
                 ) -> torch.Tensor:
    """(n, k) candidate classes per sample, nearest linearised boundary in ``norm`` first (k = min(pool,
    classes-1)): the margin over the gradient's dual norm (L1 for L-inf, L2 for L2)."""
    return _ranked(model, x, y, pool, norm)[0]


def _ranked(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, pool: int, norm: str
            ) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`rank_targets` and the logits at x its forward pass computed (the attack's clean check reads them)."""
    x = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        logits = model(x).float()
        k = max(1, min(int(pool), logits.shape[1] - 1))
        others = logits.detach().scatter(1, y[:, None], float("-inf"))
        cand = others.topk(k, dim=1).indices
        z_y = logits.gather(1, y[:, None]).squeeze(1)
        dist = torch.empty(len(x), k, device=x.device)
        for j in range(k):
            diff = z_y - logits.gather(1, cand[:, j:j + 1]).squeeze(1)
            (g,) = torch.autograd.grad(diff.sum(), x, retain_graph=j < k - 1)
            dual = g.flatten(1).abs().sum(1) if norm == "linf" else g.flatten(1).norm(dim=1)
            dist[:, j] = diff.detach() / (dual + 1e-12)
    # a NaN distance (non-finite gradient) goes last, so a broken estimate never crowds out a real one
    dist = torch.nan_to_num(dist, nan=float("inf"))
    return cand.gather(1, dist.argsort(dim=1, stable=True)), logits.detach()


class _BestPoint(torch.nn.Module):
    """The library's model during one targeted run, keeping per sample the untargeted DLR loss at the run's best
    point from the logits the run computes anyway (design 8; a forward pass per sample and target before).

    The library's rule for that point (``attack_single_run``): the starting point, then each iterate whose targeted
    DLR loss is strictly above the best so far; every one of its forward passes is of the whole batch, one per
    iteration, so replaying the rule on those logits finds the point the run returns. Where the calls are not that
    shape (another library version), :attr:`nearness` is None and the caller makes the forward pass instead."""

    def __init__(self, net: torch.nn.Module, obj: object, y: torch.Tensor) -> None:
        super().__init__()
        self.net, self.obj, self.y = net, obj, y
        self.calls = 0
        self.shaped = True
        self.best: Optional[torch.Tensor] = None
        self.near: Optional[torch.Tensor] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        self.calls += 1
        if out.dim() != 2 or len(out) != len(self.y):
            self.shaped = False
            return out
        with torch.no_grad():
            z = out.detach().float()
            t = self.obj.dlr_loss_targeted(z, self.y)
            u = dlr_losses(z, self.y)
            if self.best is None:
                self.best, self.near = t.clone(), u.clone()
            else:
                up = t > self.best
                self.best = torch.where(up, t, self.best)
                self.near = torch.where(up, u, self.near)
        return out

    def nearness(self, steps: int) -> Optional[torch.Tensor]:
        return self.near if self.shaped and self.calls == steps + 1 else None


@attacks.register("apgd_ranked")
@dataclass
class APGDRanked(Attack):
    name = "apgd_ranked"
    norm = "linf"
    loss_kind = "margin"

    eps: float = 4 / 255
    steps: int = 100
    targets: int = 2
    first: int = 1  # 1-based rank of the first target attacked
    pool: int = 9  # candidate classes scored (the highest logits besides the true one)
    rho: float = 0.75
    # per sample of the next call, candidate classes in the order to attack (a ladder's measured ranking); not a
    # setting: it never enters the attack's settings, keys or description
    order: Optional[torch.Tensor] = field(default=None, init=False, repr=False, compare=False)

    label = "APGD-T (ranked targets)"

    def describe(self) -> str:
        which = f"targets {self.first}-{self.first + self.targets - 1}" if self.targets > 1 else f"target {self.first}"
        head = "APGD-T" if self.norm == "linf" else "APGD-T-L2"
        return f"{head}-{self.steps} ({which} of {self.pool} ranked by boundary distance)"

    def validate(self, loc: str = "") -> None:
        super().validate(loc)
        from ...errors import UserError

        for name in ("targets", "first", "pool"):
            if getattr(self, name) < 1:
                raise UserError(f"{loc}attack 'apgd_ranked': {name} must be >= 1, got {getattr(self, name)}")
        if self.first + self.targets - 1 > self.pool:
            raise UserError(f"{loc}attack 'apgd_ranked': targets {self.first}..{self.first + self.targets - 1} go "
                            f"beyond the {self.pool} ranked candidates; raise pool or lower first/targets")

    def passes(self) -> Tuple[float, float]:
        """The ranking's forward pass (also the clean check) and its ``pool`` backward passes, one gradient pass per
        iteration and target (the nearness at a target's best point is read from the run's own passes)."""
        return 1.0, float(self.pool + self.steps * self.targets)

    def perturb(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bounds: Bounds,
                generator: torch.Generator) -> torch.Tensor:
        from pyautoattack.autopgd_base import APGDAttack_targeted

        need_classes(self, model, x, 4, "'apgd_ranked'")
        first, targets, pool = self.first, self.targets, self.pool
        best = torch.full((len(x),), float("-inf"), device=x.device)
        given = self.order
        if given is not None and (given.dim() != 2 or len(given) != len(x)):
            raise ValueError(f"apgd_ranked: order must be (n, k) for the {len(x)} samples, got {tuple(given.shape)}")

        def build(net: torch.nn.Module, eps: float, seed: int) -> APGDAttack_targeted:
            return APGDAttack_targeted(net, n_iter=self.steps, norm=LIBRARY_NORM[self.norm],
                                       n_restarts=1, eps=eps, seed=seed,
                                       rho=self.rho, n_target_classes=1, device=x.device, logger=quiet_logger())

        def call(obj: APGDAttack_targeted, u: torch.Tensor, yy: torch.Tensor) -> torch.Tensor:
            obj.init_hyperparam(u)
            u = u.detach().float()
            adv = u.clone()
            if given is None:
                order, clean = _ranked(obj.model, u, yy, pool, self.norm)  # its forward pass is the clean check
            else:
                order = given.to(u.device)
                with torch.no_grad():
                    clean = obj.model(u)
            robust = clean.argmax(1) == yy
            reach = torch.full(order.shape, float("-inf"), device=u.device)
            torch.random.manual_seed(obj.seed)
            net = obj.model
            for k in range(first - 1, min(first - 1 + targets, order.shape[1])):
                idx = (robust & (order[:, k] >= 0)).nonzero().squeeze(1)
                if not idx.numel():
                    continue
                obj.y_target = order[idx, k]
                obj.model = seen = _BestPoint(net, obj, yy[idx])
                try:
                    x_best, acc, _, adv_k = obj.attack_single_run(u[idx], yy[idx])
                finally:
                    obj.model = net
                near = seen.nearness(self.steps)
                if near is None:
                    with torch.no_grad():
                        near = dlr_losses(net(x_best), yy[idx])
                best[idx] = torch.maximum(best[idx], near.detach().float().reshape(-1))
                reach[idx, k] = near.detach().float().reshape(-1)
                hit = (acc.reshape(-1) == 0).nonzero().squeeze(1)
                robust[idx[hit]] = False
                adv[idx[hit]] = adv_k[hit]
            self.stats["target_order"], self.stats["target_reach"] = order, reach
            return adv

        x_adv = run_library(self, model, x, y, bounds, generator, build, call)
        # the best untargeted DLR loss per sample (> 0: broken): how near the boundary the attack came, which a
        # convergence ladder uses to pick the samples its later rounds attack
        self.stats["best_loss"] = best
        return x_adv


APGDRankedL2 = register_l2(APGDRanked, "apgd_ranked_l2", "APGD-T-L2 (ranked targets)")
