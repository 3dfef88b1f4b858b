"""The standard protocol's attack on some rows of a batch, and the verdict pass on its points.

One module because two benchmarks run it: the ``adversarial`` unit (the user's row) and the ladder's rung 0 when
it walks that row again in another process (``ladder/rung0.py``); the two walks must be the same computation for the
records not to depend on where the row ran.
"""
from __future__ import annotations

from typing import Any, Tuple

import torch

from ..attacks.base import aligned_draws
from ..runtime.device import attack_precision
from ..runtime.health import check_finite
from ..specs import Unit
from . import evidence


def standard_walk(ctx: Any, unit: Unit, attack: Any, x: torch.Tensor, y: torch.Tensor, sel: torch.Tensor,
                  gen: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
    """The standard protocol's attack on rows ``sel`` of a batch: (the points, x itself where not attacked; their
    verdict logits, fp32, the whole batch in one pass). One function for the row and for the ladder's rung 0 when
    it walks the row again in another process, so the two walks are the same computation."""
    x_adv = x.clone()
    if len(sel):
        # draws made for the whole batch, then taken at the attacked rows: a sample's random start does
        # not depend on which other samples are attacked (common random numbers across models whose
        # clean top-5 sets differ, and rbp.attack on the same batch draws the same)
        with attack_precision(ctx.device, ctx.spec.precision), aligned_draws(len(x), sel.cpu()):
            x_adv[sel] = attack(ctx.attacked_model(), x[sel], y[sel], bounds=(0.0, 1.0), generator=gen,
                                trace=evidence.wants_trace(ctx))
        check_finite(x_adv[sel], ctx, unit, "attack")
    with torch.inference_mode():
        adv_logits = ctx.verdict_model()(x_adv).float()
    return x_adv, adv_logits
