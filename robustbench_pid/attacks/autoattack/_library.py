"""Run one of pyautoattack's component attacks (APGD, APGD-T, FAB, Square) under the harness's rules.

Why one helper: every library attack needs the same four wrappers, and getting one wrong silently
changes results. (1) Its seed is drawn from the run's generator (the classes otherwise seed from a
constant or the clock) and the global RNG it reseeds is restored afterwards (``fork_rng``), so it
neither ignores nor disturbs the run's seeding. (2) Any box, or no box (paper protocol), maps onto
the [0, 1] box the library clamps to (``_box``). (3) Passes are counted by a ``Counted`` model and
charged to the telemetry per sample (each forwarded row to its nearest clean image), which also keeps each sample's
search progress (``stats``: ``margin_best``, ``margin_half``, ``passes``). (4) The library's zero-gradient
warnings go to a silent logger: the harness reports gradients itself.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any, Callable, Optional

import torch

from .._box import to_unit_box
from ..base import Attack, Bounds, project_ball
from ..square import rng_devices, seed_from
from ..telemetry import Counted

Build = Callable[[torch.nn.Module, float, int], Any]  # (model on [0, 1], eps in box units, seed) -> attack

_QUIET = logging.getLogger("robustbench_pid.library_attacks")
_QUIET.setLevel(logging.ERROR)


def quiet_logger() -> logging.Logger:
    """A logger the library's informational warnings go to (dropped: level ERROR)."""
    return _QUIET


def n_targets(requested: int, n_classes: int, what: str) -> int:
    """Target classes a targeted attack can use: at most ``n_classes - 1`` (the library indexes
    the sorted logits by target rank and would fail beyond that); fewer than requested is said."""
    k = max(1, min(int(requested), int(n_classes) - 1))
    if k < int(requested):
        warnings.warn(f"attack {what}: targets={requested} but this model has only {n_classes - 1} classes besides "
                      f"the true one; it runs with targets={k}", UserWarning, stacklevel=3)
    return k


def run_library(attack: Attack, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bounds: Bounds,
                generator: torch.Generator, build: Build,
                call: Optional[Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]] = None) -> torch.Tensor:
    """``build`` the library attack on the boxed model, run it on (x, y), return points in the ball."""
    seed = seed_from(generator)
    counted = Counted(model, x, labels=y, eps=attack.eps, norm=attack.norm)
    boxed, u, eps, back = to_unit_box(counted, x, attack.eps, bounds)
    obj = build(boxed, eps, seed)
    with torch.random.fork_rng(devices=rng_devices(x)):
        u_adv = call(obj, u, y) if call is not None else obj.perturb(u, y)
        counted.settle(attack.telemetry)
    attack.stats.update(counted.progress() or {})  # how near, and how lately, the search came (the ladder's stop rule)
    # undo the affine map, then remove its float rounding (~1e-8) so the ball holds exactly
    return project_ball(back(u_adv.detach()), x, attack.eps, bounds, attack.norm)


def need_classes(attack: Attack, model: torch.nn.Module, x: torch.Tensor, least: int, what: str) -> int:
    """The model's class count, refused below ``least``: the DLR loss reads the third (targeted: fourth)
    largest logit, so the library fails with an IndexError on fewer classes."""
    from ...errors import UserError

    n = classes_of(attack, model, x)
    if n < least:
        raise UserError(f"attack {what} needs a model of at least {least} classes (its DLR loss reads the "
                        f"{least - 1}rd-largest logit and beyond); this model has {n}: use apgd_ce or loss='ce'")
    return n


def classes_of(attack: Attack, model: torch.nn.Module, x: torch.Tensor) -> int:
    """Number of classes, from one forward pass of the first image (targeted attacks need it); the pass
    is charged to that sample in the attack's telemetry, so the pass counts stay complete."""
    with torch.no_grad():
        n = int(model(x[:1]).shape[1])
    if attack.telemetry is not None:
        attack.telemetry.charge(torch.zeros(1, dtype=torch.long, device=attack.telemetry.forward.device))
    return n
