"""``--save-adv`` on the torch side: a unit's final points handed to its image file, in 8 bits where that loses
nothing the verdict depends on.

Per sample the candidate is the image on the 8-bit grid (round(255 x) / 255), for an L-inf condition moved to the
nearest grid value inside the eps-ball of the clean image. It is kept in 8 bits only when, checked here on the
very batch that was scored: (1) it lies in the ball as tightly as the attack's own point did,
``||q - x||_inf <= max(eps, ||x_adv - x||_inf)`` (other norms: only when q equals x_adv exactly, e.g. a clean
ImageNet image, which is on the grid); (2) the verdict model gives it the same predicted class and the same
top-5 verdict as x_adv (one extra forward pass per sample). Otherwise the sample is stored as the float32 image the
attack returned, so re-scoring a saved image gives the recorded verdict either way. An ImageNet image costs
150,528 bytes in 8 bits and 602,112 in float32 (3 x 224 x 224 values; docs/results.md).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from ..attacks.base import still_correct
from ..results.files.adversarial import SIDECAR, ImageParts
from ..specs import Unit


def keep_adversarial(ctx: Any, unit: Unit, sample_ids: Sequence[Any], x: torch.Tensor, x_adv: torch.Tensor,
                     y: torch.Tensor, norm: str, eps: float, logits: Optional[torch.Tensor] = None) -> None:
    """Add one batch (or a whole ladder unit) of final points to the unit's image file; nothing without
    --save-adv. ``logits``: the verdict pass's fp32 logits of ``x_adv`` when the caller has them."""
    if not getattr(ctx.spec, "save_adv", False):
        return
    model = ctx.verdict_model()
    x, x_adv = x.detach().float(), x_adv.detach().to(x.device).float()
    y = y.to(x.device)
    q = eight_bit(x, x_adv, norm, eps)
    qf = q.float() / 255
    if norm == "linf":
        dist = (qf - x).abs().flatten(1).amax(1)
        own = (x_adv - x).abs().flatten(1).amax(1)
        ok = dist <= torch.maximum(own, torch.full_like(own, float(eps)))
    else:
        ok = (qf == x_adv).flatten(1).all(1)
    bs = max(1, int(getattr(ctx, "batch_size", 0) or len(x)))
    with torch.inference_mode():
        ref = logits.float() if logits is not None else torch.cat([model(x_adv[i:i + bs]).float()
                                                                    for i in range(0, len(x), bs)])
        got = torch.cat([model(qf[i:i + bs]).float() for i in range(0, len(x), bs)])
    same = ((got.argmax(1) == ref.argmax(1)) & (still_correct(got, y, 5) == still_correct(ref, y, 5))
            & torch.isfinite(got).all(1))
    parts = ctx.sidecars.setdefault(unit.key, {}).setdefault(SIDECAR, ImageParts())
    parts.add(sample_ids, q.cpu().numpy(), x_adv.cpu().numpy(), (ok & same).cpu().numpy())


def eight_bit(x: torch.Tensor, x_adv: torch.Tensor, norm: str, eps: float) -> torch.Tensor:
    """The 8-bit candidate of each image: the nearest grid value, inside the L-inf ball of ``x`` where the ball
    holds one (the caller checks the result, so a ball without a grid value only costs the 8 bits)."""
    k = torch.round(x_adv * 255)
    if norm == "linf":
        lo = torch.ceil(((x - eps).clamp(0, 1) * 255) - 1e-4)
        hi = torch.floor(((x + eps).clamp(0, 1) * 255) + 1e-4)
        k = torch.minimum(torch.maximum(k, lo), hi)
    return k.clamp(0, 255).to(torch.uint8)
