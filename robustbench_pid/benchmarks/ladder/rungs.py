"""A rung: one attack family's run in one round, and how to run it on the samples it is given.

``families.planned_round`` says which rungs a round runs; ``run_rung`` runs one on (x, y) in batches and returns a
:class:`RungResult`: the verdicts, the passes and, where the attack reports them, the lowest verdict margin each
sample's search reached inside the ball (the stop rule's evidence of how near it came)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ...attacks import make_attack
from ...runtime.health import NonFiniteError


@dataclass
class Rung:
    """One rung: an attack with settings, the round it belongs to, and which samples it runs on."""

    id: str
    attack: str
    params: Dict[str, Any]
    family: str = ""  # a family's name (``families.FAMILIES``), or "" for the evidence-driven rungs (EOT, SPSA)
    round: int = 1
    scope: str = "robust"  # robust | near | edge (a fresh start) | no-gradient
    # APGD-T's full runs: per attacked sample, its candidate classes nearest first as round 1's sweep measured them
    order: Optional[torch.Tensor] = field(default=None, repr=False, compare=False)
    # Square's full runs: per attacked sample, (sign pattern of its best point, queries done) to continue from
    resume: Optional[Tuple[torch.Tensor, torch.Tensor]] = field(default=None, repr=False, compare=False)

    @property
    def kind(self) -> str:
        """Whose evidence this rung's margins are: Square's (``free``) or the gradient families' (``gradient``)."""
        return "free" if self.family == "free" else "gradient"

    def describe(self) -> str:
        text = make_attack(self.attack, **self.params).describe()
        if self.resume is not None:
            text = text.replace("Square-", "Square +", 1) + ", continuing each sample's run from its best point"
        return text if self.order is None else text.replace("ranked by boundary distance", "ranked by round 1's sweep")


@dataclass
class RungResult:
    """What one rung did to the samples it attacked: top-1 correct after it, passes, the points it returned and,
    where the attack reports it, ``margin_best``: the lowest verdict margin ``z_y - max_{j != y} z_j`` at any point it
    tried inside the ball (how near its search came)."""

    still: torch.Tensor
    forward: torch.Tensor
    backward: torch.Tensor
    x_adv: Optional[torch.Tensor] = None
    margin_best: Optional[torch.Tensor] = None
    target_order: Optional[torch.Tensor] = None  # APGD-T: (n, k) classes in the order attacked ...
    target_reach: Optional[torch.Tensor] = None  # ... and the nearness its run on each reached (-inf: not attacked)
    signs: Optional[torch.Tensor] = None  # Square: per sample, the sign pattern of its best point (int8) ...
    done: Optional[torch.Tensor] = None  # ... and the queries its run(s) have done: what a later run continues


Check = Callable[[torch.Tensor, str], None]


def finite_or_stop(rung: Rung) -> Check:
    """The check ``run_rung`` applies without one from the runner: NaN/inf inputs or logits stop the ladder
    (an all-NaN row's argmax is class 0, which would count a class-0 sample as robust)."""
    def check(t: torch.Tensor, stage: str) -> None:
        if not bool(torch.isfinite(t).all()):
            raise NonFiniteError(f"the model gave non-finite {'inputs' if stage == 'attack' else 'logits'} in the "
                                 f"ladder's rung {rung.id!r}; its verdicts would be meaningless, so it stopped. "
                                 f"Check the checkpoint and try --precision fp32")
    return check


def run_rung(rung: Rung, model: torch.nn.Module, verdict_model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
             generator: torch.Generator, batch_size: int, trace: bool = False, check: Optional[Check] = None,
             report: Optional[Callable[[int, int, int, float, float], None]] = None) -> RungResult:
    """Run ``rung``'s attack on (x, y) in batches: its :class:`RungResult`, the verdict pass included in the
    forward count. ``check(tensor, stage)`` sees every adversarial batch ("attack") and its logits ("verdict"),
    and raises on NaN/inf (default: :func:`finite_or_stop`); ``report(done, total, broken, fwd, bwd)`` hears after each
    batch (with the batch's passes, summed over its samples)
    (the progress line)."""
    check = check or finite_or_stop(rung)
    attack = make_attack(rung.attack, **rung.params)
    still, fwd, bwd, adv, best_m, orders, reach = [], [], [], [], [], [], []
    signs, done = [], []
    for s in range(0, len(x), max(1, batch_size)):
        xb, yb = x[s:s + batch_size], y[s:s + batch_size]
        if rung.order is not None:
            attack.order = rung.order[s:s + batch_size]
        if rung.resume is not None:
            attack.resume = (rung.resume[0][s:s + batch_size], rung.resume[1][s:s + batch_size])
        x_adv = attack(model, xb, yb, bounds=(0.0, 1.0), generator=generator, trace=trace)
        check(x_adv, "attack")
        with torch.no_grad():
            logits = verdict_model(x_adv).float()
        check(logits, "verdict")
        still.append(logits.argmax(1) == yb)
        adv.append(x_adv.detach())
        tel = attack.telemetry
        zeros = torch.zeros(len(xb), device=xb.device)
        fwd.append((tel.forward if tel is not None else zeros) + 1)
        bwd.append(tel.backward if tel is not None else zeros)
        stats = getattr(attack, "stats", {})
        inf = torch.full((len(xb),), float("inf"), device=xb.device)
        best_m.append(stats.get("margin_best", inf).to(xb.device))
        if "signs" in stats:
            signs.append(stats["signs"].cpu())
            done.append(stats["done"].cpu())
        if "target_order" in stats:
            orders.append(stats["target_order"].cpu())
            reach.append(stats["target_reach"].cpu())
        if report is not None:
            report(min(s + batch_size, len(x)), len(x), int(sum(int((~t).sum()) for t in still)),
                   float(fwd[-1].sum()), float(bwd[-1].sum()))
    same = len(orders) == len(still) and len({o.shape[1] for o in orders}) == 1
    kept = len(signs) == len(still) and len(still) > 0
    return RungResult(torch.cat(still), torch.cat(fwd), torch.cat(bwd), torch.cat(adv), torch.cat(best_m),
                      torch.cat(orders) if same else None,
                      torch.cat(reach) if same else None, torch.cat(signs) if kept else None,
                      torch.cat(done) if kept else None)
