"""SLD, sparse L1 descent (Tramer & Boneh 2019), written here because no library in our stack has one
to use at run time (torchattacks has none; cleverhans is not a dependency; foolbox's, a correct
one with an exact projection, is the independent reference in the tests).

Per step: gradient ``g`` of the cross-entropy; keep the coordinates whose ``|g|`` is at or above
the ``q``-th percentile of that sample's ``|g|``; step ``step_size * sign(g) * mask / mask.sum()``
(a step of exactly unit L1 length times ``step_size``); project the total perturbation onto the
L1 ball of radius ``eps`` exactly (Duchi et al. 2008, sort-based; not a rescale, which would
shrink every coordinate and undo the sparsity); clip to the valid range.
``clip_grad=True`` first zeroes gradient entries that would push a coordinate already at a bound
further out of the box (cleverhans' ``clip_grad``), so the sparse budget is not wasted there.

Defaults are cleverhans' (as the papers ran it): eps 10 (L1; for 3x224x224 images, not bounded
by 1), step 1, 20 iterations, q 99, no random start.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import attacks
from .base import Attack, Bounds, clip, draw


def project_l1_ball(v: torch.Tensor, eps: float) -> torch.Tensor:
    """Exact Euclidean projection of each row of ``v`` (flattened per sample) onto {w: |w|_1 <= eps}.

    Duchi, Shalev-Shwartz, Singer, Chandra (2008), Fig. 1: sort |v| descending, find the largest
    rho with u_rho > (sum_{j<=rho} u_j - eps) / rho, soft-threshold by theta = (sum_{j<=rho} u_j - eps) / rho.
    Rows already inside the ball are returned unchanged.
    """
    shape = v.shape
    flat = v.reshape(len(v), -1)
    a = flat.abs()
    inside = a.sum(1) <= eps
    if bool(inside.all()):
        return v
    u, _ = a.sort(dim=1, descending=True)
    css = u.cumsum(1)
    j = torch.arange(1, u.shape[1] + 1, device=v.device, dtype=v.dtype)
    cond = u * j > (css - eps)
    rho = (cond * j).amax(1).clamp(min=1)  # 1-based index of the last True (cond holds on a prefix)
    theta = (css.gather(1, (rho - 1).long()[:, None]).squeeze(1) - eps) / rho
    w = flat.sign() * (a - theta[:, None]).clamp(min=0)
    w = torch.where(inside[:, None], flat, w)
    return w.reshape(shape)


def top_percentile_mask(g: torch.Tensor, q: float) -> torch.Tensor:
    """Per sample: |g| >= its q-th percentile (linear interpolation, as numpy/torch.quantile)."""
    a = g.reshape(len(g), -1).abs()
    thr = torch.quantile(a.float(), q / 100.0, dim=1, keepdim=True).to(a.dtype)
    return (a >= thr).reshape(g.shape)


@attacks.register("sld")
@dataclass
class SLD(Attack):
    name = "sld"
    norm = "l1"
    eps_max = float("inf")  # an L1 radius grows with the image size; not bounded by 1

    eps: float = 10.0
    step_size: float = 1.0
    iterations: int = 20
    q: float = 99.0  # grad_sparsity: percentile of |g| below which coordinates are left alone
    clip_grad: bool = False
    random_start: bool = False

    label = "SLD"
    paper_eps = 10.0

    def describe(self) -> str:
        parts = [f"step {self.step_size:g}", f"q {self.q:g}"]
        parts += ["clipped gradient"] if self.clip_grad else []
        parts += ["random start"] if self.random_start else []
        return f"SLD-{self.iterations} ({', '.join(parts)})"

    def validate(self, loc: str = "") -> None:
        super().validate(loc)
        from ..errors import UserError

        if not (0.0 <= self.q < 100.0):
            raise UserError(f"{loc}attack 'sld': q must be in [0, 100), got {self.q}")
        if not self.step_size > 0:
            raise UserError(f"{loc}attack 'sld': step_size must be > 0, got {self.step_size}")

    def perturb(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bounds: Bounds,
                generator: torch.Generator) -> torch.Tensor:
        x_adv = x.clone()
        if self.random_start:  # a random point of the L1 ball (Laplace direction, uniform radius)
            d = draw("exponential", x.shape, generator, x.device, x.dtype)
            d = torch.where(draw("rand", x.shape, generator, x.device, x.dtype) < 0.5, -d, d)
            d = d / d.flatten(1).abs().sum(1).clamp_min(1e-12).view(-1, *[1] * (x.dim() - 1))
            r = draw("rand", (len(x),), generator, x.device, x.dtype) * self.eps
            x_adv = clip(x + d * r.view(-1, *[1] * (x.dim() - 1)), bounds)
        view = (-1,) + (1,) * (x.dim() - 1)
        for _ in range(self.iterations):
            grad, _ = self.input_grad(model, x_adv, y)
            if self.clip_grad and bounds is not None:
                lo, hi = bounds
                grad = grad.masked_fill(((x_adv <= lo) & (grad < 0)) | ((x_adv >= hi) & (grad > 0)), 0.0)
            mask = top_percentile_mask(grad, self.q) & (grad != 0)
            count = mask.flatten(1).sum(1).clamp_min(1).to(x.dtype).view(view)
            step = grad.sign() * mask / count
            x_adv = x + project_l1_ball(x_adv + self.step_size * step - x, self.eps)
            x_adv = clip(x_adv, bounds)
        return x_adv
