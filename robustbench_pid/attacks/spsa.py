"""SPSA (Uesato et al. 2018), gradient-free L-inf attack, batched over samples and seeded.

Written here rather than taken from a library because cleverhans' PyTorch ``spsa`` estimates the
gradient at ``2x`` instead of at the current point ``x + delta`` (cleverhans#1249: its loss closure
adds ``x`` and is then called on ``x + noise`` again), and processes one image at a time;
torchattacks' SPSA is only right untargeted. This one:

- minimizes the margin ``z_y - max_{j != y} z_j`` (cleverhans' margin logit loss; the gather/mask
  form is right for negative logits too);
- estimates its gradient at the current point ``x + delta`` with ``n_samples`` Rademacher
  directions ``v`` and both signs: ``mean_v (L(x+delta+d v) - L(x+delta-d v)) / (2 d) * v``
  (``d`` is the finite-difference size ``fd_delta``);
- feeds the estimate to Adam (lr ``lr``), then projects onto the eps-ball and the valid range;
- starts from a uniform random point of the ball (as cleverhans does), drawn from the generator,
  as are all Rademacher directions, so a seed reproduces a run exactly;
- all samples of a batch and all their ``2 * n_samples`` probes go through the model together
  (in slices of ``max_batch`` images; by default 256 on a CPU, 4,096 on a GPU). The directions are
  drawn slice after slice from one generator, so the slice size never changes a result: it is left
  out of a condition's identity.

Early stop (``early_stop=True``): a sample leaves the loop once its label leaves the top-``stop_topk``
predictions, keeping that point, so its verdict is final (same accuracy, less cost). The default
``stop_topk = 1`` matches the margin loss, which targets top-1: SPSA costs ``2 * n_samples``
forward passes per iteration and sample (10,240 per sample at the defaults), and running on until
the label leaves the top-5 would multiply that on samples whose top-1 already broke. The top-5
recorded under SPSA is therefore an upper bound, not a worst case. The ``paper`` protocol turns
early stopping off (cleverhans runs every iteration and returns the last iterate).

Defaults are the papers' settings: eps 0.1, 40 iterations, lr 0.01, delta 0.01, 128 samples.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

from . import attacks
from .base import Attack, Bounds, clip, draw, project_linf, still_correct

AUTO_SLICE_CPU, AUTO_SLICE_CUDA = 256, 4096  # ``max_batch=0``: images per forward pass by device


def margin(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per sample ``z_y - max_{j != y} z_j`` (negative once misclassified)."""
    z_y = logits.gather(1, y[:, None]).squeeze(1)
    other = logits.masked_fill(torch.nn.functional.one_hot(y, logits.shape[1]).bool(), float("-inf")).amax(1)
    return z_y - other


@attacks.register("spsa")
@dataclass
class SPSA(Attack):
    name = "spsa"
    norm = "linf"
    uses_gradients = False
    loss_kind = "margin"

    eps: float = 0.1
    iterations: int = 40
    lr: float = 0.01
    fd_delta: float = 0.01  # cleverhans' ``delta``: finite-difference probe size
    n_samples: int = 128  # Rademacher directions per iteration (each probed at +d and -d)
    random_start: bool = True
    early_stop: bool = True
    stop_topk: int = 1
    max_batch: int = 0  # images per forward pass; 0: by device (memory and speed only, never the result)

    label = "SPSA"
    paper_eps = 0.1
    not_identity = ("max_batch",)

    def passes(self) -> Tuple[float, float]:
        """Each iteration probes ``n_samples`` directions at +d and -d."""
        return float(self.iterations * 2 * self.n_samples), 0.0

    def describe(self) -> str:
        parts = [f"{self.n_samples} directions", f"lr {self.lr:g}", f"δ {self.fd_delta:g}",
                 "random start" if self.random_start else "no random start",
                 f"early stop top-{self.stop_topk}" if self.early_stop else "last iterate"]
        return f"SPSA-{self.iterations} ({', '.join(parts)})"

    def validate(self, loc: str = "") -> None:
        super().validate(loc)
        from ..errors import UserError

        for k in ("lr", "fd_delta"):
            if not getattr(self, k) > 0:
                raise UserError(f"{loc}attack 'spsa': {k} must be > 0, got {getattr(self, k)}")
        if self.n_samples < 1 or self.max_batch < 0:
            raise UserError(f"{loc}attack 'spsa': n_samples must be >= 1 and max_batch >= 0 (0: by device)")

    def slice_size(self, device: torch.device) -> int:
        """Images per forward pass: ``max_batch``, or by device when 0. On a CPU small slices keep the
        probe tensors in cache (docs/attacks.md: 8.9 s at 256 vs 21.9 s at 4,096 on the project's
        2-core machine, identical images); a GPU needs large slices to be busy."""
        return self.max_batch or (AUTO_SLICE_CUDA if device.type == "cuda" else AUTO_SLICE_CPU)

    @torch.no_grad()
    def _forward(self, model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        mb = self.slice_size(x.device)
        return torch.cat([model(x[i:i + mb]).float() for i in range(0, len(x), mb)])

    @torch.no_grad()
    def estimate_gradient(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                          generator: torch.Generator) -> torch.Tensor:
        """SPSA estimate of the margin's gradient at ``x`` itself (the current point, not 2x).

        Samples are processed in chunks of ``max_batch // (2 * n_samples)`` so the probe tensors stay
        small; the directions are drawn chunk after chunk from the same generator.
        """
        n, shape, k = len(x), x.shape[1:], self.n_samples
        per = max(1, self.slice_size(x.device) // (2 * k))
        out = torch.empty_like(x)
        for s in range(0, n, per):
            xs, ys = x[s:s + per], y[s:s + per]
            m = len(xs)
            v = draw("sign", (m, k, *shape), generator, x.device, x.dtype)
            probes = xs[:, None] + self.fd_delta * torch.cat([v, -v], 1)  # (m, 2k, ...)
            losses = margin(self._forward(model, probes.reshape(-1, *shape)), ys.repeat_interleave(2 * k)).view(m, 2 * k)
            diff = (losses[:, :k] - losses[:, k:]) / (2 * self.fd_delta)  # (m, k)
            out[s:s + m] = (diff.view(m, k, *([1] * len(shape))) * v).mean(1)
        return out

    @torch.no_grad()
    def perturb(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bounds: Bounds,
                generator: torch.Generator) -> torch.Tensor:
        n = len(x)
        delta = torch.zeros_like(x)
        if self.random_start:
            u = draw("rand", x.shape, generator, x.device, x.dtype)
            delta = project_linf(x + (2 * u - 1) * self.eps, x, self.eps, bounds) - x
        m1, m2 = torch.zeros_like(x), torch.zeros_like(x)  # Adam moments (elementwise = per sample)
        b1, b2, adam_eps = 0.9, 0.999, 1e-8
        active = torch.arange(n, device=x.device)
        for t in range(1, self.iterations + 1):
            if self.early_stop:
                logits = self._forward(model, x[active] + delta[active])
                if self.telemetry is not None:  # the loss at the current point: free with early stopping
                    self.telemetry.observe(active, -margin(logits, y[active]), logits, y[active], backward=0)
                self.note_first_break(active, x[active] + delta[active], logits, y[active])
                active = active[still_correct(logits, y[active], self.stop_topk)]
            if active.numel() == 0:
                break
            xa, da, ya = x[active], delta[active], y[active]
            grad = self.estimate_gradient(model, xa + da, ya, generator)
            if self.telemetry is not None:
                self.telemetry.charge(active, forward=2 * self.n_samples)
            m1[active] = b1 * m1[active] + (1 - b1) * grad
            m2[active] = b2 * m2[active] + (1 - b2) * grad * grad
            step = self.lr * (m1[active] / (1 - b1 ** t)) / ((m2[active] / (1 - b2 ** t)).sqrt() + adam_eps)
            delta[active] = project_linf(xa + da - step, xa, self.eps, bounds) - xa  # descend the margin
        return clip(x + delta, bounds)
