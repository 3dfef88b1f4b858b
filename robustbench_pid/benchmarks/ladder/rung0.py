"""Rung 0: the user's own row, read rather than walked again (design 9).

The ladder starts from the number the user got: rung 0 is the user's attack with its row's seeds, random starts
and samples. Until design 8 the ladder walked that attack again (to each sample's first top-1 break), which on a
model the user's attack breaks easily was a large share of the ladder's fixed cost (the adversarially trained CNN
at 64/255 missed the forward-pass criterion by it). The row's walk now notes each sample's first top-1 break as it goes
(``Attack.note_first_break``) and leaves a :class:`RowWalk` in the chunk's memo; rung 0 reads it, and passes
only the points the verdict has not seen: a first top-1 break on a sample whose final point is top-1 correct (the
walk carried it back, or the attack's precision saw a break the fp32 verdict does not). A unit whose row ran in
another process (a shard, a resumed run) walks the row again with the same function (``standard_walk``), so
the verdicts, and the records, do not depend on where the row ran.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Tuple

import torch

from ...attacks.base import still_correct
from ...attacks.telemetry import attack_loss
from ...results.report.indicators import LIBRARY_ATTACKS, TREND_TAU, loss_trend


@dataclass
class RowWalk:
    """What the user's row did to one batch, as rung 0 needs it: its final points' top-1 verdicts, those points
    where they broke (host memory), each sample's first top-1 break where the final point is still correct
    (the only points rung 0 passes again) and the loss trend of the samples it walked (the incomplete-optimisation
    flag); per sample of the whole batch."""

    final_ok: torch.Tensor  # top-1 correct at the final point (the row's fp32 verdict; x itself where not attacked)
    x_broken: torch.Tensor  # (k, ...) host: the final points where final_ok is False ...
    broken_rows: torch.Tensor  # ... and their rows
    first: torch.Tensor  # (m, ...) device: the first top-1 break of rows whose final point is correct ...
    first_rows: torch.Tensor  # ... and their rows
    trending: torch.Tensor  # the loss still rising at the walk's end (``loss_trend`` > TREND_TAU), False if unknown

    @classmethod
    def of(cls, attack: Any, sel: torch.Tensor, x_adv: torch.Tensor, adv_logits: torch.Tensor,
           y: torch.Tensor) -> "RowWalk":
        """The walk of ``attack`` on rows ``sel`` that ended at ``x_adv`` with verdict logits ``adv_logits``."""
        n = len(y)
        final_ok = still_correct(adv_logits, y, 1)
        broken_rows = (~final_ok).nonzero().squeeze(1)
        stats = getattr(attack, "stats", {})
        seen = torch.zeros(n, dtype=torch.bool, device=y.device)
        first = x_adv.new_zeros((0,) + tuple(x_adv.shape[1:]))
        if "first_break_seen" in stats and len(sel):
            seen[sel] = stats["first_break_seen"].to(y.device)
            pts = x_adv.clone()
            pts[sel] = stats["first_break"].to(x_adv.dtype)
            first_rows = (seen & final_ok).nonzero().squeeze(1)
            first = pts[first_rows]
        else:
            first_rows = torch.zeros(0, dtype=torch.long, device=y.device)
        trending = torch.zeros(n, dtype=torch.bool, device=y.device)
        tel = attack.telemetry
        if len(sel) and attack.name not in LIBRARY_ATTACKS and tel is not None and tel.keep_trace \
                and tel.trace().shape[1] >= 2:
            end = attack_loss(attack.loss_kind, adv_logits[sel], y[sel])
            trace = torch.cat([tel.trace(), end[:, None]], 1).cpu().numpy()
            trending[sel] = torch.as_tensor(loss_trend(trace) > TREND_TAU, device=y.device)
        return cls(final_ok, x_adv[broken_rows].cpu(), broken_rows.cpu(), first, first_rows, trending)


def rung0_verdicts(walk: RowWalk, x: torch.Tensor, y: torch.Tensor, c1: torch.Tensor,
                   verdict: Callable[[torch.Tensor], torch.Tensor]
                   ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rung 0 of one user attack on a batch, from its row's walk: (top-1 robust after it, the
    incomplete-optimisation flag, the forward passes it made per sample, the worst-case point: the final point
    where it broke, else the first top-1 break the verdict confirms, else the clean image; host memory).
    ``verdict(points)`` gives fp32 logits of points (checked by the caller); only the clean top-1 correct samples
    (``c1``) count, as the verdict is top-1."""
    robust = c1 & walk.final_ok
    worst = x.detach().cpu().clone()
    hit = c1.cpu()[walk.broken_rows]
    worst[walk.broken_rows[hit]] = walk.x_broken[hit]
    fwd = torch.zeros(len(y), device=y.device)
    rows = walk.first_rows[c1[walk.first_rows]]
    if len(rows):
        pts = walk.first[c1[walk.first_rows]]
        back = ~still_correct(verdict(pts), y[rows], 1)
        robust[rows[back]] = False
        worst[rows[back].cpu()] = pts[back].cpu()
        fwd[rows] += 1
    return robust, walk.trending & robust, fwd, worst

