"""The rounds and the stop rule: when the ladder climbs on, and which status its number gets (the package
docstring says why each rule exists; docs/attacks.md, "The stop rule", says it for readers)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Tuple

import torch

from ...results.summaries.converge import (BATCH_DEPENDENT, CONVERGED, MISLED, NOT_CONVERGED, RANDOM_OUTPUTS,
                                           REDUCED, UPPER_BOUND)
from .rungs import FAMILIES, Rung, RungResult, planned_round
from .spec import LadderSpec
from .state import Ladder

RunAttack = Callable[[Rung, torch.Tensor], RungResult]


@dataclass
class Round:
    """What one round did: its number, kind ("full": every family on its scope; "continue": only the families still
    closing in, on those samples), how many samples it broke, and which families had a turn."""

    r: int
    kind: str
    broke: int
    families: set


def climb(ladder: Ladder, spec: LadderSpec, eps: float, run: RunAttack, *, unstable: bool, no_grad: torch.Tensor,
          batch_dependent: bool = False, random_gradients: bool = False,
          on_round: Optional[Callable[[int, str, Dict[str, torch.Tensor], int], None]] = None,
          norm: str = "linf") -> Ladder:
    """Run the rounds after rung 0 on ``ladder`` until the stop rule holds (see the package docstring).

    ``run(rung, idx)``: the rung's :class:`RungResult` for samples ``idx``. ``unstable``: the forward pass is random;
    ``random_gradients``: two backward passes at one input differ (either brings the EOT rungs). ``on_round(r, kind,
    scopes, square_queries)`` hears each round as it is decided (the progress bar prices it). ``norm``: the threat
    model (``planned_round``)."""
    n = len(ladder.robust)
    tol = spec.tolerance(n)
    ladder.lookahead = spec.lookahead
    no_grad = no_grad.cpu()
    gradients_missing = int((no_grad & ladder.robust).sum()) > tol
    rounds: List[Round] = []
    broke_by = {fam: False for fam in FAMILIES}
    for r in range(1, spec.rounds + spec.continue_rounds + 1):
        if not ladder.robust.any():
            break
        closing = ladder.closing_in(spec)
        if r == 1:
            kind = "full"
        elif rounds[-1].kind == "full" and rounds[-1].broke > tol:
            if r > spec.rounds:
                break  # still breaking after the rounds allowed: not converged
            kind = "full"
        elif any(bool(m.any()) for m in closing.values()):
            kind = "continue"  # the near sets broke (almost) nothing; some family was still closing in on a sample
        else:
            break
        scopes = _scopes(ladder, spec, r, kind, closing, broke_by)
        square_queries = _square_queries(ladder, spec, r, scopes["free"])
        if on_round is not None:
            on_round(r, kind, scopes, square_queries)
        broke_round, families, broke_by = 0, set(), {fam: False for fam in FAMILIES}
        first = len(ladder.history)
        for rung in planned_round(spec, eps, r, unstable or random_gradients, bool((no_grad & ladder.robust).any()),
                                  square_queries, norm):
            sel = no_grad if rung.scope == "no-gradient" else scopes[rung.family or "gradient"]
            mask = ladder.robust & sel
            idx = mask.nonzero().squeeze(1)
            if kind == "continue" and not len(idx):
                continue  # a continuation round runs only the families still closing in on some sample
            if len(idx):
                if rung.family == "targeted" and r > 1:  # the deep runs follow the sweep's measured class order
                    rung = replace(rung, order=ladder.measured_order(idx, closing["targeted"], rung.params["first"],
                                                                     rung.params["targets"], scopes["single"],
                                                                     ladder.edge_starts(spec)))
                    if rung.order is not None:  # a near miss's extra starts: its positions holding a class
                        lo = rung.params["first"] - 1
                        ran = (rung.order[:, lo:lo + rung.params["targets"]] >= 0).sum(1)
                        one = scopes["single"][idx.cpu()]
                        ladder.near_tries[idx.cpu()[one]] += ran[one].to(ladder.near_tries.dtype)
                if rung.family == "free" and r > 1:  # Square continues each sample's search from its best point
                    rung = replace(rung, resume=ladder.square_state(idx))
                res = run(rung, idx)
                ladder.charge(rung.id, idx, res.forward, res.backward)
                broke = ladder.record(rung, idx, res)
            else:
                broke = ladder.record(rung, idx, RungResult(torch.ones(0, dtype=torch.bool), torch.zeros(0),
                                                            torch.zeros(0)))
            broke_round += broke
            if rung.family:
                broke_by[rung.family] |= broke > 0
            if rung.family:
                families.add(rung.family)
        for h in ladder.history[first:]:
            h["kind"] = kind
        rounds.append(Round(r, kind, broke_round, families))
    ladder.status, ladder.detail = verdict(ladder, spec, tol, rounds, gradients_missing, int(no_grad.sum()),
                                           batch_dependent, unstable)
    return ladder


def _scopes(ladder: Ladder, spec: LadderSpec, r: int, kind: str, closing: Dict[str, torch.Tensor],
            broke_by: Optional[Dict[str, bool]] = None) -> Dict[str, torch.Tensor]:
    """Per family (and "gradient" for the evidence-driven rungs): the samples its rung attacks this round. Round 1:
    every still-robust sample. A later full round: for the ascent families (APGD-T, APGD-CE) the nearest samples and
    those the family was still closing in on; for the search families (FAB-T, Square) those they were still closing
    in on, for Square the misled ones too, and their own nearest only after a round in which they broke a sample
    (``broke_by``; design 6: on the grid Square never broke a sample and FAB-T one, in round 1, while their runs on
    the nearest were most of the ladder's forward passes on the adversarially trained CNN). A continuation round:
    only the closing-in ones.
    ``single``: the near misses in APGD-T's scope only as such (not closing in, not among the nearest this round): their
    extra start attacks the one class they came nearest on (``Ladder.near_misses_left``).
    A round's scopes are fixed at its start, so its rungs share them."""
    if r == 1:
        every = ladder.robust.clone()
        return {**{f: every for f in FAMILIES + ("gradient",)}, "single": torch.zeros_like(every)}
    out: Dict[str, torch.Tensor] = {}
    nearest = torch.zeros_like(ladder.robust)  # the round's near set of the gradient families (full rounds)
    for fam in FAMILIES:
        if kind == "continue":
            out[fam] = closing[fam].clone()
            continue
        if fam in ("boundary", "free"):  # where the search was still closing in (Square: and where the gradient
            out[fam] = closing[fam].clone()  # families did no better than it); its own nearest only after it broke
            if fam == "free":
                out[fam] |= ladder.misled()
            if (broke_by or {}).get(fam):
                out[fam] |= ladder.near(spec.near_share, spec.near_min, "free" if fam == "free" else "gradient")
            continue
        nearest = ladder.near(spec.near_share, spec.near_min, "gradient")
        out[fam] = nearest | closing[fam]
    out["gradient"] = out["targeted"]
    out["single"] = (closing["targeted"] & ~ladder.closing["targeted"] & ~nearest) | (ladder.edge_left(spec) & ~nearest)
    return out


def _square_queries(ladder: Ladder, spec: LadderSpec, r: int, scope: torch.Tensor) -> int:
    """Square's new queries this round (the same for every sample in its ``scope``): round 1 ``square_queries``;
    later, as many more as the least any sample in the scope had done times ``square_growth - 1`` (each run continues
    from the sample's best point, so its search runs to twice its queries), and no sample past Square's cap. Where
    Square keeps no state to continue from (its L2 form: a point is no sign pattern), a fresh run of the total a
    continued search would have reached (``square_queries * square_growth ** (r - 1)``), as designs 4-6 ran."""
    if r == 1:
        return spec.square_queries
    scope = scope & ladder.robust
    if not bool(scope.any()):
        return spec.square_new(r)
    done = ladder.square_done[scope]
    used = float(ladder.spent["free"][scope].max())
    if bool((done > 0).all()):
        new = float(done.min()) * (spec.square_growth - 1)
    else:
        new = float(spec.square_queries * spec.square_growth ** (r - 1))
    return int(max(1, min(new, spec.cap("free") - used)))


def verdict(ladder: Ladder, spec: LadderSpec, tol: int, rounds: List[Round], gradients_missing: bool,
            n_no_grad: int, batch_dependent: bool = False, unstable: bool = False) -> Tuple[str, str]:
    """(status, one-line detail) of a finished ladder."""
    if gradients_missing:
        return UPPER_BOUND, (f"input gradients are zero or not finite for both CE and DLR losses on {n_no_grad} "
                             f"sample(s); only gradient-free rungs could attack them, so the robust accuracy is only an "
                             f"upper bound")
    if batch_dependent:
        return BATCH_DEPENDENT, ("the model's outputs for a sample change with the other samples in its batch (a "
                                 "batch-level statistic, or BatchNorm left in training mode), so a verdict scored in one "
                                 "batch need not hold in another: no robust accuracy can be called converged")
    if unstable:
        return RANDOM_OUTPUTS, ("repeated forward passes of the same images disagree (a randomised model), so each "
                                "verdict is one random draw: the robust accuracy is an estimate of a random quantity "
                                "and no round can show it converged (the EOT rungs attacked the expected loss)")
    if not rounds:
        if not ladder.robust.any():
            return _reduced(spec, CONVERGED), "no sample is left robust after your attack"
        return NOT_CONVERGED, "no round ran"
    if not ladder.robust.any():
        last = rounds[-1]
        return _reduced(spec, CONVERGED), (f"no sample is left robust (round {last.r} broke the last {last.broke})"
                                           if last.broke else "no sample is left robust")
    untrusted = ladder.untrusted() if not unstable else torch.zeros_like(ladder.robust)
    k_untrusted = int(untrusted.sum())
    if k_untrusted > tol:  # whatever the search found: the gradient families' failure is no evidence there
        probe = int((untrusted & ladder.misleading).sum())
        return MISLED, (f"gradients mislead on {k_untrusted} still-robust sample(s) (tolerance {tol}): on {probe} a step "
                        f"along the gradient raised the loss no more than the same step against it, on {k_untrusted - probe} more "
                        f"the random search came nearer the boundary than every gradient attack or they never got "
                        f"nearer than the clean image; the gradient attacks' failure is no evidence there and a finite "
                        f"random search proves nothing, so the robust accuracy is only an upper bound")
    full = [x for x in rounds if x.kind == "full"][-1]
    if full.broke > tol:
        return NOT_CONVERGED, (f"round {full.r}, the last ({spec.rounds} allowed), still broke {full.broke} sample(s) "
                               f"(tolerance {tol}): raise --converge-opt rounds, or report the number as an upper bound")
    closing = ladder.closing_in(spec)
    capped = ladder.closing_in(spec, under_cap=False)
    still = torch.zeros_like(ladder.robust)
    for fam in FAMILIES:
        still |= closing[fam] | capped[fam]
    if int(still.sum()) > tol:
        fams = sorted({ladder.last_gain_family[i] for i in still.nonzero().squeeze(1).tolist()} - {""})
        why = ("their budget caps were spent" if not any(bool(m.any()) for m in closing.values()) else
               f"the {spec.rounds + spec.continue_rounds} rounds allowed ran out")
        return NOT_CONVERGED, (f"the search was still closing in on {int(still.sum())} still-robust sample(s) "
                               f"({', '.join(fams) or 'no family named'}) when {why} (tolerance {tol}): the number is an "
                               f"upper bound")
    if not set(FAMILIES) <= full.families:
        return NOT_CONVERGED, "not every attack family had its turn"
    last = rounds[-1]
    extra = (f"; {sum(1 for x in rounds if x.kind == 'continue')} further round(s) ran the families still closing "
             f"in until each stalled" if last.kind == "continue" else "")
    where = "every still-robust sample" if full.r == 1 else "the nearest still-robust samples"
    return _reduced(spec, CONVERGED), (f"round {full.r} ({where}: ranked APGD-T, APGD-CE, FAB-T, Square) broke "
                                       f"{full.broke} sample(s) (tolerance {tol}), and every family had stalled on "
                                       f"every sample left robust{extra}")


def _reduced(spec: LadderSpec, status: str) -> str:
    cut = spec.reductions()
    return f"{REDUCED} ({', '.join(cut)})" if cut and status == CONVERGED else status
