"""The per-sample state of one chunk's ladder: which samples are robust, which rung broke each, the passes each
rung spent, the worst-case point found, and the evidence the stop rule reads: how near each family's search came
to the boundary (``nearness`` to rank samples, ``margin`` to compare families on one sample), what each family spent
on each sample, and whether it was still closing in when its last run ended (``closing``)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch

from .rungs import FAMILIES, Rung, RungResult
from .spec import LadderSpec

KINDS = ("gradient", "free")  # whose evidence: the gradient families' (and EOT's), or the random search's


@dataclass
class Ladder:
    """The per-sample state of one chunk's ladder: robust now, which rung broke it, passes per rung, the
    worst-case point found (the breaking point; the clean image while robust), nearness to the boundary."""

    robust: torch.Tensor  # bool, top-1 correct under every rung so far (and clean)
    broken_by: List[str] = field(default_factory=list)  # rung id or "" per sample
    forward: Dict[str, torch.Tensor] = field(default_factory=dict)  # rung id -> forward images per sample
    backward: Dict[str, torch.Tensor] = field(default_factory=dict)
    history: List[Dict[str, Any]] = field(default_factory=list)  # per rung: id, attacked, broke, round, settings
    worst: Optional[torch.Tensor] = None  # per sample: the worst-case point (CPU)
    # per kind of evidence (``Rung.near_by``): per sample, the best margin loss its rungs reached (-inf: none)
    nearness: Dict[str, torch.Tensor] = field(default_factory=dict)
    # per kind: per sample, the lowest verdict margin z_y - max z_j its rungs reached inside the ball (+inf: none)
    margin: Dict[str, torch.Tensor] = field(default_factory=dict)
    clean_margin: Optional[torch.Tensor] = None  # the verdict margin at the clean point (set by the benchmark)
    misleading: Optional[torch.Tensor] = None  # per sample: a gradient step raised the loss no more than one against it
    # per family: budget spent per sample (backward passes; Square: queries), and "its last run was still closing in"
    spent: Dict[str, torch.Tensor] = field(default_factory=dict)
    closing: Dict[str, torch.Tensor] = field(default_factory=dict)
    family_margin: Dict[str, torch.Tensor] = field(default_factory=dict)  # per family: its lowest margin per sample
    last_gain_family: List[str] = field(default_factory=list)  # per sample: the family that last gained ...
    last_gain: Optional[torch.Tensor] = None  # ... and how much margin its run's last half gained
    # per sample: the candidate classes nearest first by what round 1's APGD-T sweep reached on each (-1: none yet);
    # the deep rounds attack them in this order (the measured distance, which the linearised ranking only estimates)
    target_order: Optional[torch.Tensor] = None
    target_reach: Optional[torch.Tensor] = None  # per sample and class of that order: the nearness any run reached
    deep_done: Optional[torch.Tensor] = None  # per sample and class of that order: had a deep (round >= 2) run
    near_tries: Optional[torch.Tensor] = None  # per sample: the extra APGD-T starts it had as a near miss
    square_signs: Optional[torch.Tensor] = None  # per sample: the sign pattern of Square's best point (int8) ...
    square_done: Optional[torch.Tensor] = None  # ... and Square's queries on it: where its next run continues
    lookahead: float = LadderSpec.lookahead  # the stop rule's (``climb`` sets the spec's)
    status: str = ""
    detail: str = ""

    def __post_init__(self) -> None:
        n = len(self.robust)
        if not self.broken_by:
            self.broken_by = [""] * n
        if not self.last_gain_family:
            self.last_gain_family = [""] * n
        if self.last_gain is None:
            self.last_gain = torch.zeros(n)
        if self.misleading is None:
            self.misleading = torch.zeros(n, dtype=torch.bool)
        if self.near_tries is None:
            self.near_tries = torch.zeros(n, dtype=torch.long)
        if self.square_done is None:
            self.square_done = torch.zeros(n)
        for kind in KINDS:
            self.nearness.setdefault(kind, torch.full((n,), float("-inf")))
            self.margin.setdefault(kind, torch.full((n,), float("inf")))
        for fam in FAMILIES:
            self.spent.setdefault(fam, torch.zeros(n, dtype=torch.float64))
            self.closing.setdefault(fam, torch.zeros(n, dtype=torch.bool))
            self.family_margin.setdefault(fam, torch.full((n,), float("inf")))

    def charge(self, rung: str, idx: torch.Tensor, fwd: torch.Tensor, bwd: torch.Tensor) -> None:
        n = len(self.robust)
        for store, v in ((self.forward, fwd), (self.backward, bwd)):
            t = store.setdefault(rung, torch.zeros(n, dtype=torch.float64))
            t[idx.cpu()] += v.detach().double().cpu()

    def record(self, rung: Rung, idx: torch.Tensor, res: RungResult) -> int:
        """Apply a rung's verdicts (``res.still``: top-1 correct after it, per attacked sample)."""
        idx = idx.cpu()
        hit = ~res.still.cpu()
        broke = idx[hit]
        for i in broke.tolist():
            self.broken_by[i] = rung.id
        self.robust[broke] = False
        if self.worst is not None and res.x_adv is not None and len(broke):
            self.worst[broke] = res.x_adv[hit.to(res.x_adv.device)].detach().to(self.worst.device, self.worst.dtype)
        if res.nearness is not None and len(idx):
            t = self.nearness[rung.near_by]
            t[idx] = torch.maximum(t[idx], res.nearness.detach().float().cpu())
        self._progress(rung, idx, res)
        if rung.family == "free" and res.signs is not None and len(idx):
            if self.square_signs is None:
                self.square_signs = torch.zeros((len(self.robust), *res.signs.shape[1:]), dtype=torch.int8)
            self.square_signs[idx] = res.signs.to(torch.int8).cpu()
            self.square_done[idx] = res.done.float().cpu()
        if rung.family == "targeted" and rung.round == 1 and res.target_order is not None and len(idx):
            self._measured_order(idx, res.target_order, res.target_reach)
        elif rung.family == "targeted" and res.target_order is not None and len(idx):
            self._deep_reach(idx, res.target_order, res.target_reach)
        self.history.append({"id": rung.id, "attacked": int(len(idx)), "broke": int(len(broke)),
                             "full": rung.scope == "robust", "label": rung.attack, "round": rung.round,
                             "family": rung.family, "scope": rung.scope, "settings": rung.describe()})
        return int(len(broke))

    def _progress(self, rung: Rung, idx: torch.Tensor, res: RungResult) -> None:
        """The exhaustion evidence of one run: budget spent, lowest margin, and whether the family was still closing
        in on each sample it left robust: the margin left is at most ``lookahead`` times what the run's last half
        gained over the family's best before it (``lookahead``, the spec's; a crossing it did not return counts as
        closing in)."""
        if not len(idx) or rung.family not in FAMILIES:
            if res.margin_best is not None and len(idx):
                t = self.margin[rung.near_by]
                t[idx] = torch.minimum(t[idx], res.margin_best.detach().float().cpu())
            return
        units = res.forward if rung.family == "free" else res.backward
        self.spent[rung.family][idx] += units.detach().double().cpu()
        if res.margin_best is None:
            return
        best = res.margin_best.detach().float().cpu()
        half = res.margin_half.detach().float().cpu() if res.margin_half is not None else best
        t = self.margin[rung.near_by]
        t[idx] = torch.minimum(t[idx], best)
        # the family's whole budget on the sample is the reference: a fresh run (Square restarts from its stripes, APGD
        # from a random start) always gains early in its own run, so what the last half gained is measured against the
        # lowest margin the family had reached before it, in earlier runs or this run's first half
        fam = self.family_margin[rung.family]
        before = torch.minimum(half, fam[idx])
        fam[idx] = torch.minimum(fam[idx], best)
        gain = torch.where(torch.isfinite(best) & torch.isfinite(before), (before - best).clamp(min=0),
                           torch.zeros_like(best))
        self.closing[rung.family][idx] = self.robust[idx] & torch.isfinite(best) & (best <= self.lookahead * gain)
        for j, i in enumerate(idx.tolist()):
            if float(gain[j]) > 0:
                self.last_gain_family[i], self.last_gain[i] = rung.family, float(gain[j])

    def _measured_order(self, idx: torch.Tensor, order: torch.Tensor, reach: torch.Tensor) -> None:
        """Keep, per sample the sweep attacked, its classes sorted by the nearness the sweep reached on each
        (nearest first; ties and classes it did not attack keep the sweep's own order), and that nearness."""
        k = order.shape[1]
        if self.target_order is None or self.target_order.shape[1] != k:
            self.target_order = torch.full((len(self.robust), k), -1, dtype=torch.long)
            self.target_reach = torch.full((len(self.robust), k), float("-inf"))
            self.deep_done = torch.zeros((len(self.robust), k), dtype=torch.bool)
        rank = torch.sort(reach.float(), dim=1, descending=True, stable=True).indices
        self.target_order[idx] = order.long().gather(1, rank)
        self.target_reach[idx] = reach.float().gather(1, rank)

    def _deep_reach(self, idx: torch.Tensor, order: torch.Tensor, reach: torch.Tensor) -> None:
        """Fold a deep run's nearness per class into the table kept in the sweep's order."""
        if self.target_order is None or order.shape[1] != self.target_order.shape[1]:
            return
        same = self.target_order[idx][:, :, None] == order.long()[:, None, :]  # (n, k, k): column j holds class c
        got = torch.where(same, reach.float()[:, None, :], torch.full_like(same, float("-inf"), dtype=torch.float))
        self.target_reach[idx] = torch.maximum(self.target_reach[idx], got.amax(2))
        self.deep_done[idx] |= torch.isfinite(got.amax(2))

    def measured_order(self, idx: torch.Tensor, closing: Optional[torch.Tensor] = None, first: int = 1,
                       targets: int = 1, single: Optional[torch.Tensor] = None,
                       edge: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """The class order for a deep APGD-T run on samples ``idx`` that attacks positions ``first`` ..
        ``first + targets - 1``: the sweep's measured order (the next ranks each round), except that a sample the
        family was still closing in on (``closing``) gets, at those positions, the class it came nearest on so far (a
        fresh start where the search was closing in, not the next ranks) and the classes no deep run has had yet
        (:meth:`_fresh_targets`), and a sample in ``single`` (a near miss's extra start) only the nearest, the other
        positions -1 (skipped), or, on the boundary's edge (``edge``: per sample, the starts it has left there,
        :meth:`edge_starts`), the nearest at as many positions as it has starts left: fresh starts there. None where
        any sample has no measured order (the attack then ranks them itself)."""
        if self.target_order is None or not len(idx):
            return None
        cpu = idx.cpu()
        rows = self.target_order[cpu].clone()
        if not bool((rows >= 0).all()):
            return None
        if closing is not None:
            k = rows.shape[1]
            lo, hi = max(0, first - 1), min(k, first - 1 + targets)
            for j in closing[cpu].nonzero().squeeze(1).tolist():
                i = int(cpu[j])
                head = self._fresh_targets(i, hi - lo)
                rest = torch.tensor([c for c in self.target_order[i].tolist() if c not in head.tolist()],
                                    dtype=head.dtype)
                if single is not None and bool(single.cpu()[i]):
                    starts = max(1, min(len(head), int(edge.cpu()[i]))) if edge is not None else 1
                    head = torch.cat([head[:1].repeat(starts), torch.full((len(head) - starts,), -1, dtype=head.dtype)])
                rows[j] = torch.cat([rest[:lo], head, rest[lo:]])
        return rows

    def _fresh_targets(self, i: int, m: int) -> torch.Tensor:
        """``m`` classes for a sample the targeted family goes on with: the class any run came nearest on (a fresh
        start there: cnn_at 48/255, two deep runs stopped at 0.005 and 0.009 of it and AutoAttack's next start
        crossed), then the classes no deep run has had yet in the sweep's measured order (cnn_at 64/255 sample 1482:
        the sweep's 12 iterations put class 2 fourth, the deep runs went to ranks 1-3 and then back to the nearest,
        and class 2, which a 100-iteration run crosses, never had one), then the next nearest."""
        by_reach = self.target_order[i][torch.sort(self.target_reach[i], descending=True, stable=True).indices]
        head = [int(by_reach[0])]
        fresh = [int(c) for c, d in zip(self.target_order[i].tolist(), self.deep_done[i].tolist()) if not d]
        for c in fresh + [int(c) for c in by_reach.tolist()]:
            if len(head) >= m:
                break
            if c not in head:
                head.append(c)
        return torch.tensor(head, dtype=torch.long)

    def square_state(self, idx: torch.Tensor):
        """(sign pattern, queries done) of Square's best point on samples ``idx``, for its next run to continue
        from; None where any of them has no earlier run (that run starts afresh)."""
        cpu = idx.cpu()
        if self.square_signs is None or not len(cpu) or not bool((self.square_done[cpu] > 0).all()):
            return None
        return self.square_signs[cpu], self.square_done[cpu]

    def closing_in(self, spec: LadderSpec, under_cap: bool = True) -> Dict[str, torch.Tensor]:
        """Per family, the still-robust samples it was still closing in on, with budget left under its cap, and for
        the targeted family its near misses with tries left (:meth:`near_misses_left`) (``under_cap=False``: those
        still closing in whose cap is spent)."""
        out = {}
        for fam in FAMILIES:
            left = self.spent[fam] < spec.cap(fam)
            going = self.closing[fam] | (self.near_misses_left(spec) if fam == "targeted" and under_cap else False)
            out[fam] = self.robust & going & (left if under_cap else ~left)
            if fam == "targeted" and under_cap:  # the boundary's edge: its starts are not bounded by the cap
                out[fam] |= self.edge_left(spec)
        return out

    def edge_left(self, spec: LadderSpec) -> torch.Tensor:
        """The near misses on the boundary's edge (at most ``spec.edge`` of the clean margin left) with extra starts
        left: there another start may land on either side (cnn_at 48/255, design 9's draw: a sample left robust
        after its starts on its nearest class, which AutoAttack's start crossed), so a stall there is no evidence, the
        cap that bounds a family's evidence elsewhere does not bound it, and the targeted family gives it
        ``edge_tries`` more starts on its nearest class (``targets`` a round)."""
        return self.edge_starts(spec) > 0

    def edge_starts(self, spec: LadderSpec) -> torch.Tensor:
        """Per sample, the extra starts it has left on the boundary's edge (0 elsewhere; :meth:`edge_left`)."""
        if self.clean_margin is None:
            return torch.zeros(len(self.robust), dtype=torch.long)
        on_edge = self.near_miss(spec) & (self.margin["gradient"] <= spec.edge * self.clean_margin.float())
        left = (spec.near_tries + spec.edge_tries - self.near_tries).clamp(min=0)
        return torch.where(on_edge, left, torch.zeros_like(left))

    def near_misses_left(self, spec: LadderSpec) -> torch.Tensor:
        """The near misses (:meth:`near_miss`) the targeted family has not yet given its ``near_tries`` extra starts:
        one fresh start on the class it came nearest on tests whether the stall was that start's; if it stalls short
        as well (and gained nothing that calls it closing in), two starts stalled there and the family has spent
        its evidence (design 7: going on to the cap was a large share of cnn_at 64/255's forward passes, on
        three near misses, where only the first extra start ever broke one)."""
        return (self.near_miss(spec) & (self.near_tries < spec.near_tries)) | self.edge_left(spec)

    def near_miss(self, spec: LadderSpec) -> torch.Tensor:
        """Mask of the still-robust samples on which a gradient search stalled at the boundary's edge: at most
        ``spec.near_miss`` of the clean verdict margin left. A stall there is no evidence (another start lands on
        either side: cnn_at 48/255, a deep APGD-T run stopped at 0.005 of a clean 3.8 and AutoAttack's next start
        crossed), so the targeted family goes on there, on the classes it came nearest on, until its cap; at the cap
        the stall counts as the family's (AutoAttack's budget was spent), unlike a search still gaining."""
        if self.clean_margin is None:
            return torch.zeros_like(self.robust)
        m = self.margin["gradient"]
        return self.robust & torch.isfinite(m) & (m <= spec.near_miss * self.clean_margin.float())

    def untrusted(self) -> torch.Tensor:
        """Mask of the still-robust samples on which the gradient families' failure is no evidence: a step along the
        gradient raised the loss no more than the step against it (``misleading``, the probe's), the random search came
        strictly nearer the boundary than every gradient rung (same verdict margin, same sample), or the gradient
        rungs never got nearer than the clean point. On a healthy model a gradient step beats the opposite one and
        gradient ascent comes nearer than a random search of the same ball; where not, its gradients mislead."""
        free, grad = self.margin["free"], self.margin["gradient"]
        worse = self.misleading | (torch.isfinite(free) & (free < grad))
        if self.clean_margin is not None:
            c = self.clean_margin.float()
            worse |= torch.isfinite(grad) & (grad >= c - 1e-6 * c.abs().clamp(min=1.0))
        return self.robust & worse

    def _left(self, by: str) -> torch.Tensor:
        """Per sample, minus the share of its clean verdict margin that ``by``'s searches left (higher = nearer;
        -inf without a margin or a clean margin)."""
        m = self.margin[by]
        if self.clean_margin is None:
            return torch.full_like(m, float("-inf"))
        left = -m / self.clean_margin.float().clamp(min=1e-12)
        return torch.where(torch.isfinite(left), left, torch.full_like(left, float("-inf")))

    def misled(self) -> torch.Tensor:
        """Mask of the still-robust samples on which Square came at least as near the boundary as the gradient
        families (the same scale-free DLR margin): a short random search matching 100-iteration gradient attacks
        says their gradients mislead there, so only the gradient-free search is evidence about them."""
        free, grad = self.nearness["free"], self.nearness["gradient"]
        return self.robust & torch.isfinite(free) & (free >= grad)

    def near(self, share: float, least: int, by: str = "gradient") -> torch.Tensor:
        """Mask of the still-robust samples nearest the boundary by ``by``'s evidence: the ``share`` (at least
        ``least``) with the lowest verdict margin left, as a share of the sample's clean margin (every family of that
        kind counts: APGD-CE may come nearer than APGD-T; design 5 ranked by APGD-T's DLR loss alone and never gave
        the deep APGD-T runs a sample APGD-CE had brought to 0.005 of a clean 3.4); ties and samples without one keep
        sample order. Without verdict margins (an attack that does not report them), the highest nearness (the
        scale-free DLR loss); where that kind has no evidence on any still-robust sample, the other kind's."""
        rob = self.robust.nonzero().squeeze(1)
        k = min(len(rob), max(int(least), math.ceil(share * len(rob))))
        score = self._left(by)[rob]
        if len(rob) and not bool(torch.isfinite(score).any()):
            score = self.nearness[by][rob]
        if len(rob) and not bool(torch.isfinite(score).any()):
            score = self.nearness["free" if by == "gradient" else "gradient"][rob]
        order = torch.sort(score, descending=True, stable=True).indices
        mask = torch.zeros_like(self.robust)
        mask[rob[order[:k]]] = True
        return mask


