"""The convergence ladder's probes: cheap checks of the model that decide which rungs run and which status a
ladder may claim. Each answers one question about the model at the clean points, before any rung:

- ``predictions_unstable``: do repeated forward passes disagree (a randomised model: the EOT rungs run)?
- ``batch_dependent``: does a sample's output change with the other samples in its batch (a batch statistic,
  BatchNorm left in training mode)? Then the rungs, which score verdicts on ever smaller subsets, could call a
  sample robust in one batch and broken in another: the ladder never says ``converged``;
- ``gradients_unavailable``: are the input gradients of both the CE and the DLR loss zero or not finite
  (only the gradient-free rungs can attack such a sample; the number is an upper bound)?
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..attacks.base import dlr_losses


def gradients_unavailable(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per sample: are the input gradients of both the CE and the DLR loss zero or not finite at x?
    One forward and two backward passes. CE alone would call a model with scaled-up logits gradient-free."""
    x = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        logits = model(x).float()
        (g_ce,) = torch.autograd.grad(F.cross_entropy(logits, y, reduction="none").sum(), x, retain_graph=True,
                                      allow_unused=True)
        (g_dlr,) = torch.autograd.grad(dlr_losses(logits, y).sum(), x, allow_unused=True)

    def bad(g: Optional[torch.Tensor]) -> torch.Tensor:
        if g is None:
            return torch.ones(len(x), dtype=torch.bool, device=x.device)
        g = g.flatten(1)
        return ~(g.abs().amax(1) > 0) | ~torch.isfinite(g).all(1)

    return bad(g_ce) & bad(g_dlr)


def predictions_unstable(model: torch.nn.Module, x: torch.Tensor, logits: torch.Tensor, rtol: float,
                         draws: int = 2) -> bool:
    """Do repeated clean forward passes disagree (argmax, or logits beyond ``rtol`` of their scale)?
    A randomised model (dropout left on, random transforms) needs expectation over transformation."""
    scale = float(logits.abs().max()) + 1e-12
    with torch.no_grad():
        for _ in range(draws):
            again = model(x).float()
            if (again.argmax(1) != logits.argmax(1)).any() or float((again - logits).abs().max()) > rtol * scale:
                return True
    return False


def batch_dependent(model: torch.nn.Module, x: torch.Tensor, logits: torch.Tensor, rtol: float, probes: int = 4
                    ) -> bool:
    """Do the logits of a few samples scored alone (batches of one), and in another company (the batch in
    reverse order), differ from their logits in the batch they were scored in (``logits``) beyond ``rtol`` of the
    logits' scale? ``probes`` + 1 forward passes. Kernels for other batch sizes round differently (about 1e-6
    of the scale in fp32, 1e-3 in bf16), so ``rtol`` sits well above rounding and far below what a batch
    statistic does (the whole scale). A batch of one sample cannot show a dependence: False."""
    if len(x) < 2:
        return False
    scale = float(logits.abs().max()) + 1e-12
    k = min(int(probes), len(x))
    with torch.no_grad():
        alone = torch.cat([model(x[i:i + 1]).float() for i in range(k)])
        flipped = model(x.flip(0)).float().flip(0)
    for got, want in ((alone, logits[:k]), (flipped, logits)):
        if not bool(torch.isfinite(got).all()) or float((got - want.float()).abs().max()) > rtol * scale:
            return True
    return False
