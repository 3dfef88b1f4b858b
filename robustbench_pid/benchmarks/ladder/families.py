"""The four attack families, each with its round-1 run, its full budget and how that budget continues what round 1
left (the loop in ``stop.py`` only asks each family for its rung and runs it on the samples it is given).

- APGD-T (``targeted``): round 1 sweeps every ranked target briefly; its full budget is AutoAttack's 9 targets x
  100 iterations, attacking the classes in the order the sweep came nearest on each sample (the measured distance,
  which the linearised ranking only estimates).
- APGD-CE (``ce``): AutoAttack's 100 iterations in round 1; that is its full budget.
- FAB-T (``boundary``): no round-1 run (round 1 is the three fast finders of near samples; on the design grid one
  target x 50 in round 1 broke at most one sample a cell in design 10's runs, for 11-18% of round 1's
  backward passes); its full budget is AutoAttack's 9 targets x 100.
- Every family's ``fresh`` rung is its whole AutoAttack budget as a new run (one of an edge sample's fresh starts;
  scope ``edge``).
- Square (``free``): 500 queries in round 1; its full budget continues each sample's search from its best point to
  5,000 queries (the L-inf Square's points are ``clip(x + eps * s)``, so the sign pattern restores the point, and
  the square-size schedule goes on where it stopped: AutoAttack's one 5,000-query run, paused). Its L2 form keeps no
  such state and runs 5,000 queries afresh.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Optional

import torch

from ...results.summaries.converge import rung_id
from .rungs import Rung, RungResult
from .spec import LadderSpec


class Family:
    """One family: ``first`` (round 1's rung; None where it has none), ``full`` (the full budget's rung; None where round 1 spent it),
    ``prepare`` (a full rung given what the family kept of round 1 on samples ``idx``) and ``keep`` (what it keeps)."""

    name = ""
    base = ""

    def first(self, spec: LadderSpec, eps: float, norm: str) -> Optional[Rung]:
        return None

    def full(self, spec: LadderSpec, eps: float, r: int, norm: str) -> Optional[Rung]:
        return None

    def fresh(self, spec: LadderSpec, eps: float, r: int, norm: str) -> Optional[Rung]:
        """The family's whole AutoAttack budget as a new run, for an edge sample's fresh start in round ``r``."""
        rung = self.full(spec, eps, r, norm)
        return None if rung is None else replace(rung, scope="edge")

    def prepare(self, rung: Rung, kept: Dict[str, Any], idx: torch.Tensor, spec: LadderSpec) -> Rung:
        return rung

    def keep(self, kept: Dict[str, Any], rung: Rung, idx: torch.Tensor, res: RungResult, n: int) -> None:
        return None

    def _rung(self, attack: str, params: Dict[str, Any], r: int, norm: str, scope: str = "") -> Rung:
        return Rung(rung_id(self.base, r), attack if norm == "linf" else f"{attack}_{norm}", params, self.name, r,
                    scope or ("robust" if r == 1 else "near"))


class Targeted(Family):
    name, base = "targeted", "apgd-t"

    def first(self, spec: LadderSpec, eps: float, norm: str) -> Rung:
        return self._rung("apgd_ranked", {"eps": eps, "steps": spec.sweep_steps, "targets": spec.pool, "first": 1,
                                          "pool": spec.pool}, 1, norm)

    def full(self, spec: LadderSpec, eps: float, r: int, norm: str) -> Optional[Rung]:
        return self._rung("apgd_ranked", {"eps": eps, "steps": spec.steps, "targets": spec.pool, "first": 1,
                                          "pool": spec.pool}, r, norm)

    def prepare(self, rung: Rung, kept: Dict[str, Any], idx: torch.Tensor, spec: LadderSpec) -> Rung:
        order = kept.get("order")
        if order is None or not len(idx) or not bool((order[idx.cpu()] >= 0).all()):
            return rung  # a sample the sweep did not measure: the attack ranks them itself
        return replace(rung, order=order[idx.cpu()].clone())

    def keep(self, kept: Dict[str, Any], rung: Rung, idx: torch.Tensor, res: RungResult, n: int) -> None:
        """After the sweep: per sample, its classes sorted by how near the sweep came on each (ties keep its order)."""
        if rung.round != 1 or res.target_order is None or not len(idx):
            return
        k = res.target_order.shape[1]
        if kept.get("order") is None or kept["order"].shape[1] != k:
            kept["order"] = torch.full((n, k), -1, dtype=torch.long)
        rank = torch.sort(res.target_reach.float(), dim=1, descending=True, stable=True).indices
        kept["order"][idx.cpu()] = res.target_order.long().gather(1, rank)


class CrossEntropy(Family):
    name, base = "ce", "apgd-ce"

    def first(self, spec: LadderSpec, eps: float, norm: str) -> Rung:
        return self._rung("apgd_ce", {"eps": eps, "steps": spec.steps}, 1, norm)

    def fresh(self, spec: LadderSpec, eps: float, r: int, norm: str) -> Rung:
        return self._rung("apgd_ce", {"eps": eps, "steps": spec.steps}, r, norm, "edge")


class Boundary(Family):
    name, base = "boundary", "fab-t"

    def full(self, spec: LadderSpec, eps: float, r: int, norm: str) -> Optional[Rung]:
        return self._rung("fab_t", {"eps": eps, "steps": spec.steps, "targets": spec.pool, "first": 1}, r, norm)


class Free(Family):
    name, base = "free", "square"

    def first(self, spec: LadderSpec, eps: float, norm: str) -> Rung:
        return self._rung("square", {"eps": eps, "n_queries": spec.square_queries}, 1, norm)

    def full(self, spec: LadderSpec, eps: float, r: int, norm: str) -> Optional[Rung]:
        more = spec.square_budget - spec.square_queries if norm == "linf" else spec.square_budget
        return self._rung("square", {"eps": eps, "n_queries": max(1, more)}, r, norm)

    def fresh(self, spec: LadderSpec, eps: float, r: int, norm: str) -> Rung:
        return self._rung("square", {"eps": eps, "n_queries": spec.square_budget}, r, norm, "edge")

    def prepare(self, rung: Rung, kept: Dict[str, Any], idx: torch.Tensor, spec: LadderSpec) -> Rung:
        signs, done = kept.get("signs"), kept.get("done")
        cpu = idx.cpu()
        if signs is None or not len(cpu) or not bool((done[cpu] > 0).all()):
            # a sample with no search to continue (its L2 form; a sample round 1's Square did not attack): the full
            # budget afresh, for every sample of the rung (one query count per rung)
            return replace(rung, params={**rung.params, "n_queries": spec.square_budget})
        return replace(rung, resume=(signs[cpu], done[cpu]))

    def keep(self, kept: Dict[str, Any], rung: Rung, idx: torch.Tensor, res: RungResult, n: int) -> None:
        if res.signs is None or not len(idx):
            return
        if kept.get("signs") is None:
            kept["signs"] = torch.zeros((n, *res.signs.shape[1:]), dtype=torch.int8)
            kept["done"] = torch.zeros(n)
        kept["signs"][idx.cpu()] = res.signs.to(torch.int8).cpu()
        kept["done"][idx.cpu()] = res.done.float().cpu()


ORDER: List[Family] = [Targeted(), CrossEntropy(), Boundary(), Free()]  # the order a round runs them in
BY_NAME = {f.name: f for f in ORDER}
FAMILIES = tuple(f.name for f in ORDER)


def planned_round(spec: LadderSpec, eps: float, r: int, unstable: bool, no_grad: bool,
                  norm: str = "linf", fresh: bool = False) -> List[Rung]:
    """The rungs of round ``r`` in order: round 1, each family's first run (after the EOT rungs where repeated passes
    or gradients are random; SPSA after them where some sample has no usable gradient, under L-inf: under L2 those
    are left to Square); round r >= 2, each family's full budget (``fresh``: each family's whole budget as a new run,
    APGD-CE's included: the edge samples' fresh start)."""
    out: List[Rung] = []
    if r == 1:
        n = (lambda a: a) if norm == "linf" else (lambda a: f"{a}_{norm}")
        if unstable:
            out += [Rung(f"eot-{loss}", n("apgd_eot"), {"eps": eps, "steps": spec.steps, "eot_iter": spec.eot_iter,
                                                        "loss": loss}) for loss in ("ce", "dlr")]
        out += [rung for f in ORDER if (rung := f.first(spec, eps, norm)) is not None]
        if no_grad and norm == "linf":
            out.append(Rung("spsa", "spsa", {"eps": eps, "iterations": spec.spsa_iterations,
                                             "n_samples": spec.spsa_samples}, scope="no-gradient"))
        return out
    if fresh:
        return [rung for f in ORDER if (rung := f.fresh(spec, eps, r, norm)) is not None]
    return [rung for f in ORDER if (rung := f.full(spec, eps, r, norm)) is not None]
