"""A rung: one attack family's run in one round, and how to run it on the samples it is given.

``planned_round`` says which rungs a round runs (the package docstring says why each); ``run_rung`` runs one on
(x, y) in batches and returns a :class:`RungResult`: the verdicts, the passes and, where the attack reports them,
how near each sample's search came to the boundary and how much of that its last half still gained (the
exhaustion evidence of the stop rule, ``stop.py``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ...attacks import make_attack
from ...runtime.health import NonFiniteError
from ...results.summaries.converge import rung_id
from .spec import LadderSpec

FAMILIES = ("ce", "targeted", "boundary", "free")  # the four a round must run for its verdict to count


@dataclass
class Rung:
    """One rung: an attack with settings, the round it belongs to, and which samples it runs on."""

    id: str
    attack: str
    params: Dict[str, Any]
    family: str = ""  # one of FAMILIES, or "" for the evidence-driven rungs (EOT, SPSA)
    round: int = 1
    scope: str = "robust"  # robust | near | no-gradient
    # APGD-T's deep runs: per attacked sample, its candidate classes nearest first as round 1's sweep measured them
    order: Optional[torch.Tensor] = field(default=None, repr=False, compare=False)
    # Square's later runs: per attacked sample, (sign pattern of its best point, queries done) to continue from
    resume: Optional[Tuple[torch.Tensor, torch.Tensor]] = field(default=None, repr=False, compare=False)

    @property
    def near_by(self) -> str:
        """Whose nearness picks this rung's samples in later rounds: Square's own (``free``), or the gradient
        families' (``gradient``)."""
        return "free" if self.family == "free" else "gradient"

    def describe(self) -> str:
        text = make_attack(self.attack, **self.params).describe()
        if self.resume is not None:
            text = text.replace("Square-", "Square +", 1) + ", continuing each sample's run from its best point"
        return text if self.order is None else text.replace("ranked by boundary distance", "ranked by round 1's sweep")


def planned_round(spec: LadderSpec, eps: float, r: int, unstable: bool, no_grad: bool,
                  square_queries: Optional[int] = None, norm: str = "linf") -> List[Rung]:
    """The rungs of round ``r`` in order (see the module docstring). ``square_queries``: Square's new queries this
    round as ``climb`` set them; None: the most they can be (:meth:`LadderSpec.square_new`), for cost estimates.
    ``norm``: the threat model; under L2 every family runs its L2 form (``*_l2``) and SPSA (an L-inf search) does not
    run, so samples without gradients are left to Square and make the number an upper bound as they do under L-inf."""
    s, near = spec, ("robust" if r == 1 else "near")
    n = (lambda a: a) if norm == "linf" else (lambda a: f"{a}_{norm}")
    queries = s.square_new(r) if square_queries is None else int(square_queries)
    out: List[Rung] = []
    if unstable and r == 1:
        out += [Rung("eot-ce", n("apgd_eot"), {"eps": eps, "steps": s.eot_steps, "eot_iter": s.eot_iter, "loss": "ce"}),
                Rung("eot-dlr", n("apgd_eot"), {"eps": eps, "steps": s.eot_steps, "eot_iter": s.eot_iter, "loss": "dlr"})]
    out += [
        Rung(rung_id("apgd-t", r), n("apgd_ranked"), _targeted(s, eps, r), "targeted", r, near),
        Rung(rung_id("apgd-ce", r), n("apgd_ce"), {"eps": eps, "steps": s.steps}, "ce", r, near),
        Rung(rung_id("fab-t", r), n("fab_t"), {"eps": eps, "steps": s.fab_steps, "targets": s.fab_targets,
                                            "first": (r - 1) * s.fab_targets + 1}, "boundary", r, near),
        Rung(rung_id("square", r), n("square"), {"eps": eps, "n_queries": queries},
             "free", r, near),
    ]
    if no_grad and r == 1 and norm == "linf":
        out.append(Rung("spsa", "spsa", {"eps": eps, "iterations": s.spsa_iterations, "n_samples": s.spsa_samples},
                        scope="no-gradient"))
    return out


def _targeted(s: LadderSpec, eps: float, r: int) -> Dict[str, Any]:
    """Round 1: the short sweep over every ranked candidate; round r >= 2: the next ``targets`` ranks, deep, from
    rank 1 again once the pool is used up (a continuation round past the pool: fresh starts on the nearest ranks)."""
    if r == 1:
        return {"eps": eps, "steps": s.sweep_steps, "targets": s.pool, "first": 1, "pool": s.pool}
    first = ((r - 2) * s.targets) % s.pool + 1
    return {"eps": eps, "steps": s.steps, "targets": min(s.targets, s.pool - first + 1), "first": first, "pool": s.pool}


@dataclass
class RungResult:
    """What one rung did to the samples it attacked: top-1 correct after it, passes, the points it returned and,
    where the attack reports it, each sample's best margin loss (``nearness``: scale-free DLR, higher = nearer the
    boundary, for ranking samples) and its search progress (``margin_best``: the lowest verdict margin
    ``z_y - max_{j != y} z_j`` at any point it tried inside the ball; ``margin_half``: the same over the first half of
    its passes on the sample; the gap is what the last half still gained)."""

    still: torch.Tensor
    forward: torch.Tensor
    backward: torch.Tensor
    x_adv: Optional[torch.Tensor] = None
    nearness: Optional[torch.Tensor] = None
    margin_best: Optional[torch.Tensor] = None
    margin_half: Optional[torch.Tensor] = None
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
    still, fwd, bwd, adv, near, best_m, half_m, orders, reach = [], [], [], [], [], [], [], [], []
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
        best = getattr(attack, "stats", {}).get("best_loss")
        near.append(best if best is not None else torch.full((len(xb),), float("-inf"), device=xb.device))
        stats = getattr(attack, "stats", {})
        inf = torch.full((len(xb),), float("inf"), device=xb.device)
        best_m.append(stats.get("margin_best", inf).to(xb.device))
        half_m.append(stats.get("margin_half", inf).to(xb.device))
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
    return RungResult(torch.cat(still), torch.cat(fwd), torch.cat(bwd), torch.cat(adv), torch.cat(near),
                      torch.cat(best_m), torch.cat(half_m), torch.cat(orders) if same else None,
                      torch.cat(reach) if same else None, torch.cat(signs) if kept else None,
                      torch.cat(done) if kept else None)
