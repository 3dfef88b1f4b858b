"""The rounds: round 1 on every still-robust sample, then the full budget on the near samples, tau doubling while
the last round broke more than the tolerance; the verdict is the stop rule's (``results/summaries/stop_rule.py``)."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch

from ...results.summaries.stop_rule import FRESH, edge_kinds, near, rivals, verdict
from .families import BY_NAME, planned_round
from .rungs import Rung, RungResult
from .spec import LadderSpec
from .state import Ladder

RunAttack = Callable[[object, torch.Tensor], RungResult]
OnRound = Callable[[int, Dict[str, torch.Tensor], List[Rung]], None]


def climb(ladder: Ladder, spec: LadderSpec, eps: float, run: RunAttack, *, unstable: bool, no_grad: torch.Tensor,
          batch_dependent: bool = False, random_gradients: bool = False, on_round: Optional[OnRound] = None,
          norm: str = "linf") -> Ladder:
    """Run the rounds after rung 0 on ``ladder`` and set its status (the package docstring states the rule).

    ``run(rung, idx)``: the rung's :class:`RungResult` for samples ``idx``. ``unstable``: the forward pass is random;
    ``random_gradients``: two backward passes at one input differ (either brings the EOT rungs). ``on_round(r,
    scopes, rungs)`` hears each round's samples per kind and its rungs as they are decided (the progress bar prices
    them). ``norm``: the
    threat model (every family runs its form for it)."""
    n = len(ladder.robust)
    tol = spec.tolerance(n)
    no_grad = no_grad.cpu()
    every = ladder.robust.clone()
    last = _round(ladder, spec, eps, 1, run, {"gradient": every, "free": every, "no-gradient": no_grad},
                  unstable or random_gradients, bool((no_grad & ladder.robust).any()), on_round, norm)
    tau, r = spec.near, 1
    ladder.tau = tau
    while bool(ladder.robust.any()):
        g, f = _owed(ladder, tau, tol)
        if bool((g | f).any()):  # then look again at this tau: the round moved margins, and Square may be a rival now
            r += 1
            last = _round(ladder, spec, eps, r, run, {"gradient": g, "free": f}, False, False, on_round, norm)
            ladder.full["gradient"] |= g
            ladder.full["free"] |= f
            ladder.tau = tau
            continue
        if last > tol and tau < 1:
            tau = min(1.0, 2 * tau)
            continue
        eg, ef = (torch.as_tensor(e) for e in edge_kinds(ladder.left("gradient").numpy(), ladder.left("free").numpy(),
                                                          spec.edge))
        edge = ladder.robust & ~ladder.restarted & (eg | ef)
        if not bool(edge.any()):
            break
        # the edge samples' fresh starts: more draws where one start's last steps decide, not a wider near set, so
        # what they break neither widens tau nor counts as the last round; then the rule looks again
        for _ in range(FRESH):
            g, f = ladder.robust & edge & eg, ladder.robust & edge & ef
            if not bool((g | f).any()):
                break
            r += 1
            _round(ladder, spec, eps, r, run, {"gradient": g, "free": f}, False, False, on_round, norm, fresh=True)
        ladder.restarted |= edge
        ladder.full["gradient"] |= edge & eg
        ladder.full["free"] |= edge & ef
    ladder.status, ladder.detail = verdict(ladder.evidence(no_grad, unstable, batch_dependent, spec.edge), tol,
                                           spec.reductions())
    return ladder


def _owed(ladder: Ladder, tau: float, tol: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The still-robust samples near at ``tau`` that have not had the gradient families' / Square's full budget."""
    lg, lf = ladder.left("gradient").numpy(), ladder.left("free").numpy()
    ladder.rivals = rivals(lg, lf, ladder.robust.numpy(), tol)
    g, f = near(lg, lf, tau, ladder.rivals)
    return (ladder.robust & torch.as_tensor(g) & ~ladder.full["gradient"],
            ladder.robust & torch.as_tensor(f) & ~ladder.full["free"])


def _round(ladder: Ladder, spec: LadderSpec, eps: float, r: int, run: RunAttack, scopes: Dict[str, torch.Tensor],
           eot: bool, no_grad: bool, on_round: Optional[OnRound], norm: str, fresh: bool = False) -> int:
    """Run round ``r``'s rungs, each on the still-robust samples of its kind's scope; the samples it broke
    (``fresh``: each family's whole budget as a new run, one of the edge samples' fresh starts)."""
    rungs = planned_round(spec, eps, r, eot, no_grad, norm, fresh)
    if on_round is not None:
        on_round(r, scopes, rungs)
    before = ladder.robust.clone()
    for rung in rungs:
        scope = scopes["no-gradient"] if rung.scope == "no-gradient" else scopes[rung.kind]
        idx = (ladder.robust & scope).nonzero().squeeze(1)
        if len(idx):
            if r > 1 and not fresh and rung.family in BY_NAME:  # the full budget continues from what the family kept of round 1
                rung = BY_NAME[rung.family].prepare(rung, ladder.kept[rung.family], idx, spec)
            res = run(rung, idx)
            ladder.charge(rung.id, idx, res.forward, res.backward)
        else:
            res = RungResult(torch.ones(0, dtype=torch.bool), torch.zeros(0), torch.zeros(0))
            if r > 1:
                continue  # a family with no near sample of its kind has no turn in this round
        ladder.record(rung, idx, res)
    broke = before & ~ladder.robust
    if not fresh:
        ladder.last_broke = broke
    return int(broke.sum())
