"""Carlini-Wagner L2 (2017), with the margin written correctly for negative logits.

torchattacks' CW masks the true class by multiplying logits with a one-hot (``(1 - onehot) * z``),
which turns the true class's entry into 0 and makes ``max_{j != y} z_j`` wrong whenever the other
logits are negative (torchattacks#184). Here the true class is masked with ``-inf`` instead.

Objective per sample: ``|delta|_2^2 + c * max(z_y - max_{j != y} z_j, -kappa)``, optimized with Adam
in tanh space when there is a box (so the image stays in range without clipping) and directly on
``delta`` in the unbounded ``paper`` protocol; ``c`` found per sample by binary search (x10 until
the first success, then bisection). CW is a minimum-norm attack: its result counts as a success
only if the smallest adversarial it found has L2 norm <= ``eps``; otherwise ``x`` is returned.

Defaults: 5 binary-search steps of 100 Adam iterations (lr 0.01), c starting at 0.01, kappa 0,
eps 1.0 (pixel units, L2; not bounded by 1). cleverhans runs 1,000 iterations per search step;
``steps = 1000`` reproduces that at 10x the cost.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

from . import attacks
from .base import Attack, Bounds


@attacks.register("cw")
@dataclass
class CW(Attack):
    name = "cw"
    norm = "l2"
    eps_max = float("inf")
    loss_kind = "margin"

    eps: float = 1.0
    steps: int = 100
    search_steps: int = 5
    c_init: float = 0.01
    kappa: float = 0.0
    lr: float = 0.01

    label = "CW-L2"

    def passes(self) -> Tuple[float, float]:
        """``steps`` gradient steps per binary-search step for c."""
        return 0.0, float(self.steps * self.search_steps)

    def describe(self) -> str:
        return (f"CW-L2-{self.steps} ({self.search_steps} search steps, c0 {self.c_init:g}, "
                f"κ {self.kappa:g}, lr {self.lr:g})")

    def validate(self, loc: str = "") -> None:
        super().validate(loc)
        from ..errors import UserError

        if not (self.c_init > 0 and self.lr > 0 and self.kappa >= 0):
            raise UserError(f"{loc}attack 'cw': c_init and lr must be > 0 and kappa >= 0")
        if self.search_steps < 1:
            raise UserError(f"{loc}attack 'cw': search_steps must be >= 1")

    def perturb(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bounds: Bounds,
                generator: torch.Generator) -> torch.Tensor:
        n = len(x)
        view = (-1,) + (1,) * (x.dim() - 1)
        if bounds is not None:
            lo, hi = bounds
            x01 = ((x - lo) / (hi - lo)).clamp(1e-6, 1 - 1e-6)
            w0 = torch.atanh(2 * x01 - 1)
            to_x = lambda w: lo + (hi - lo) * (torch.tanh(w) + 1) / 2  # noqa: E731
        else:
            w0 = x.clone()
            to_x = lambda w: w.clone()  # noqa: E731  (a non-leaf: no autocast cache may hold a stale copy)
        c = torch.full((n,), self.c_init, device=x.device)
        c_lo = torch.zeros(n, device=x.device)
        c_hi = torch.full((n,), float("inf"), device=x.device)
        best_l2 = torch.full((n,), float("inf"), device=x.device)
        best = x.clone()
        for _ in range(self.search_steps):
            w = w0.clone().requires_grad_(True)
            opt = torch.optim.Adam([w], lr=self.lr)
            succeeded = torch.zeros(n, dtype=torch.bool, device=x.device)
            for _ in range(self.steps):
                with torch.enable_grad():
                    xa = to_x(w)
                    logits = model(xa).float()
                    z_y = logits.gather(1, y[:, None]).squeeze(1)
                    mask = torch.nn.functional.one_hot(y, logits.shape[1]).bool()
                    other = logits.masked_fill(mask, float("-inf")).amax(1)
                    f = (z_y - other).clamp(min=-self.kappa)
                    l2sq = (xa - x).flatten(1).pow(2).sum(1)
                    loss = (l2sq + c * f).sum()
                    opt.zero_grad(set_to_none=True)
                    (grad,) = torch.autograd.grad(loss, w)
                if "grad_zero" not in self.stats:
                    self.stats["grad_zero"] = grad.flatten(1).abs().amax(1).eq(0)
                w.grad = grad
                if self.telemetry is not None:
                    self.telemetry.observe(None, other - z_y, logits, y, grad)
                with torch.no_grad():
                    fooled = (logits.argmax(1) != y) & (z_y - other <= -self.kappa)
                    l2 = l2sq.detach().sqrt()
                    better = fooled & (l2 < best_l2)
                    best_l2 = torch.where(better, l2, best_l2)
                    best[better] = xa.detach()[better]
                    succeeded |= fooled
                opt.step()
            with torch.no_grad():
                c_hi = torch.where(succeeded, torch.minimum(c_hi, c), c_hi)
                c_lo = torch.where(succeeded, c_lo, torch.maximum(c_lo, c))
                c = torch.where(torch.isinf(c_hi), c * 10, (c_lo + c_hi) / 2)
        ok = best_l2 <= self.eps
        return torch.where(ok.view(view), best, x)
