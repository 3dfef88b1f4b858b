"""The convergence ladder: attack the samples still robust with attack families that fail in different ways,
in rounds, until a round breaks (almost) nothing more, and say which kind of number came out.

Why families and not one strong attack: each family has a blind spot another covers. Cross-entropy APGD
saturates on scaled-up logits; the targeted DLR margin (APGD-T) does not, and reaches classes the untargeted
ascent walks past; a minimum-norm boundary search (FAB-T) linearises the model instead of ascending a loss;
a gradient-free random search (Square) needs no gradient at all, so a model whose gradients point the wrong
way (obfuscated, noisy, sign-flipped) fools the first three but not it. A ``converged`` resting on gradient
attacks alone was wrong on the first adversarially trained model it met (Square broke what APGD-T left).

Rounds (``planned_round``), each rung on the samples still robust after the rungs before it:
- rung 0 (``user``): the user's attack(s) with their rows' seeds and random starts, each sample walked only
  until its first top-1 break (the row walks on to break top-5 as well; rung 0 breaks every sample the row
  breaks at top-1, and any whose walk crossed the boundary and came back);
- round 1, on every still-robust sample: [EOT rungs when repeated clean passes disagree], a sweep of APGD-T
  over all ``pool`` candidate classes in the order of their linearised boundary distance (MALT's ranking;
  AutoAttack attacks the 9 highest logits for 100 iterations each) with only ``sweep_steps`` iterations per
  target, APGD-CE, FAB-T, Square with a small budget, [SPSA on samples without gradients]. Why a short sweep
  and not two deep targets: on the zoo the class a sample breaks to is often ranked 3rd to 6th, and a
  12-iteration run per class found every AutoAttack break at half the passes of two 100-iteration ones, which
  missed those ranks (docs/attacks.md). Why the targeted family first: it leaves a sample at its first break,
  while APGD-CE spends its 100 iterations on every sample it attacks, broken early or not; the samples the
  sweep breaks cost APGD-CE nothing;
- round r >= 2, only if the round before broke more than the tolerance: the same four families with a
  fresh start and a larger budget (``targets`` ranked classes at the full ``steps`` each, the next ones in
  each later round; the next FAB target; Square with ``square_growth`` times the queries into round 2, and
  in a later round only after a round in which Square broke a sample, else the same queries with fresh
  draws: a larger search budget is spent only where the search still breaks samples) on the still-robust samples
  nearest the boundary: the ``near_share`` with the highest scale-free DLR margin reached so far (A^3's
  observation that the samples a stronger attack still breaks are those a weaker one brought closest). Each
  family is judged by its own kind of evidence: Square's later runs go to the samples Square itself came
  closest on, the gradient families' to those APGD-T came closest on, because a model can fool the gradient
  attacks, whose margins then say nothing about where a gradient-free search will break it. Square's later
  runs also take every sample on which its short round-1 search came at least as near the boundary as the
  gradient families (``Ladder.misled``): on a healthy model 100 gradient iterations get much nearer than 500
  random queries, so such a sample is one whose gradients mislead, and there the gradient-free search is the
  only evidence (on a model with sign-flipped gradients, the samples only Square breaks are such samples, and
  their Square margin after 500 queries need not be among the nearest).

Stop rule: a round in which every family had its turn and which broke at most ``tolerance(n)`` =
max(tol_min, floor(tol_share * n)) samples ends the ladder ``converged``; after ``rounds`` rounds it is
``not converged``. More than the tolerance of still-robust samples without usable input gradients makes
it ``upper bound: gradients unavailable`` whatever the rounds broke; a model whose outputs depend on the
batch is ``not converged: outputs depend on the batch`` (a verdict scored in one batch need not hold in
another). A ladder with settings below the defaults (fewer steps, targets, queries, rounds, or a looser
tolerance) says so: ``converged (reduced ladder: ...)``. The rule is applied per work unit (so sharding
never changes a verdict) and once more per condition (``results/summaries/converge.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..attacks import make_attack
from ..errors import UserError
from ..runtime.health import NonFiniteError

from ..results.summaries.converge import (BATCH_DEPENDENT, CONVERGED, DESIGN, NOT_CONVERGED, REDUCED,  # noqa: F401
                                          UPPER_BOUND, rung_id)

PROBE = "probe"  # passes spent on the instability, batch-context and gradient probes
MAX_TOL_SHARE, MAX_TOL_MIN = 0.05, 10  # the loosest stop rule accepted: 5% of a unit's samples, 10 samples
FAMILIES = ("ce", "targeted", "boundary", "free")  # the four a round must run for its verdict to count


@dataclass(frozen=True)
class LadderSpec:
    """The ladder's settings (``--converge-tol``, ``--converge-opt KEY=VALUE``); part of the unit key.

    Why these defaults: docs/attacks.md's grid measures them against AutoAttack and a stronger reference."""

    tol_share: float = 0.001  # stop when a round breaks at most this share of the samples ...
    tol_min: int = 1  # ... or this many, whichever is larger
    steps: int = 100  # APGD-CE and deep APGD-T iterations per run (AutoAttack standard)
    pool: int = 9  # candidate classes the ranking scores (the highest logits besides the true one)
    sweep_steps: int = 12  # round 1's APGD-T: every ranked candidate, this many iterations each
    targets: int = 3  # rounds >= 2: this many ranked targets at ``steps`` each (round r: ranks (r-2)*targets+1 ...)
    fab_steps: int = 50
    fab_targets: int = 1  # FAB-T targets per round (round r: the next ones by logit)
    square_queries: int = 500  # Square's queries in round 1 ...
    square_growth: int = 2  # ... times this into round 2 (1,000), and into a later round only after Square broke a sample
    rounds: int = 3
    near_share: float = 0.2  # rounds >= 2 attack this share of the still-robust samples, nearest first ...
    near_min: int = 8  # ... and at least this many
    eot_steps: int = 100
    eot_iter: int = 20  # AutoAttack's rand version
    spsa_iterations: int = 40  # SPSA runs only on samples without usable gradients
    spsa_samples: int = 128
    unstable_rtol: float = 1e-3  # repeated clean logits differing by more than this (relative): randomised
    batch_rtol: float = 1e-2  # a sample's logits alone vs in its batch differing by more: batch-dependent

    @classmethod
    def from_options(cls, options: Optional[Dict[str, Any]]) -> "LadderSpec":
        options = dict(options or {})
        names = {f.name: f.type for f in fields(cls)}
        unknown = sorted(k for k in options if k not in names)
        if unknown:
            raise UserError(f"unknown --converge-opt key(s) {', '.join(map(repr, unknown))}; valid: {', '.join(names)}")
        clean: Dict[str, Any] = {}
        for k, v in options.items():
            want = float if names[k] in ("float", float) else int
            try:
                if isinstance(v, bool):
                    raise ValueError
                clean[k] = want(v) if want is float or float(v).is_integer() else None
                if clean[k] is None:
                    raise ValueError
            except (TypeError, ValueError, OverflowError):
                raise UserError(f"--converge-opt {k}={v!r}: expected a {'number' if want is float else 'whole number'}")
        spec = cls(**clean)
        spec.check()
        return spec

    def check(self) -> None:
        # a ladder whose last round may still break more than this is not converged in any useful sense
        if not (0 <= self.tol_share <= MAX_TOL_SHARE) or not math.isfinite(self.tol_share):
            raise UserError(f"--converge-tol must be a share in [0, {MAX_TOL_SHARE}] (0.001 = 0.1%), got "
                            f"{self.tol_share}")
        if not 0 <= self.tol_min <= MAX_TOL_MIN:
            raise UserError(f"--converge-opt tol_min must be in [0, {MAX_TOL_MIN}] samples, got {self.tol_min} (for "
                            f"a larger tolerance on large work units, raise --converge-tol, a share)")
        for name in ("unstable_rtol", "batch_rtol"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise UserError(f"--converge-opt {name} must be a finite number >= 0, got {v}")
        if not (math.isfinite(self.near_share) and 0 < self.near_share <= 1):
            raise UserError(f"--converge-opt near_share must be a share in (0, 1], got {self.near_share}")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name not in ("tol_share", "tol_min", "unstable_rtol", "batch_rtol", "near_share") and v < 1:
                raise UserError(f"--converge-opt {f.name} must be >= 1, got {v}")
        if (self.rounds - 1) * self.targets > self.pool:
            need = (self.rounds - 1) * self.targets
            raise UserError(f"--converge-opt: {self.rounds - 1} deep rounds of {self.targets} ranked targets need "
                            f"{need} candidates but pool is {self.pool}; raise pool or lower rounds/targets")

    def tolerance(self, n: int) -> int:
        """How many samples a round may still break for the ladder to count as converged."""
        return max(int(self.tol_min), int(math.floor(self.tol_share * n + 1e-9)))

    def as_dict(self) -> Dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def reductions(self) -> List[str]:
        """The settings weaker than the defaults ('steps 25 < 100'): a ladder with any is a reduced ladder,
        whose ``converged`` says so. Thresholds of the probes (``*_rtol``) are not budgets: not counted."""
        base = LadderSpec()
        out = []
        for f in fields(self):
            v, d = getattr(self, f.name), getattr(base, f.name)
            if f.name.endswith("_rtol"):
                continue
            looser = v > d if f.name in ("tol_share", "tol_min") else v < d
            if looser:
                out.append(f"{f.name} {v:g} {'>' if v > d else '<'} {d:g}")
        return out


@dataclass
class Rung:
    """One rung: an attack with settings, the round it belongs to, and which samples it runs on."""

    id: str
    attack: str
    params: Dict[str, Any]
    family: str = ""  # one of FAMILIES, or "" for the evidence-driven rungs (EOT, SPSA)
    round: int = 1
    scope: str = "robust"  # robust | near | no-gradient

    @property
    def near_by(self) -> str:
        """Whose nearness picks this rung's samples in later rounds: Square's own (``free``), or the gradient
        families' (``gradient``)."""
        return "free" if self.family == "free" else "gradient"

    def describe(self) -> str:
        return make_attack(self.attack, **self.params).describe()


def planned_round(spec: LadderSpec, eps: float, r: int, unstable: bool, no_grad: bool,
                  square_queries: Optional[int] = None) -> List[Rung]:
    """The rungs of round ``r`` in order (see the module docstring). ``square_queries``: Square's budget this
    round as ``climb`` grew it; None: the largest it can be (grown into every round), for cost estimates."""
    s, near = spec, ("robust" if r == 1 else "near")
    queries = s.square_queries * s.square_growth ** (r - 1) if square_queries is None else int(square_queries)
    out: List[Rung] = []
    if unstable and r == 1:
        out += [Rung("eot-ce", "apgd_eot", {"eps": eps, "steps": s.eot_steps, "eot_iter": s.eot_iter, "loss": "ce"}),
                Rung("eot-dlr", "apgd_eot", {"eps": eps, "steps": s.eot_steps, "eot_iter": s.eot_iter, "loss": "dlr"})]
    out += [
        Rung(rung_id("apgd-t", r), "apgd_ranked", _targeted(s, eps, r), "targeted", r, near),
        Rung(rung_id("apgd-ce", r), "apgd_ce", {"eps": eps, "steps": s.steps}, "ce", r, near),
        Rung(rung_id("fab-t", r), "fab_t", {"eps": eps, "steps": s.fab_steps, "targets": s.fab_targets,
                                            "first": (r - 1) * s.fab_targets + 1}, "boundary", r, near),
        Rung(rung_id("square", r), "square", {"eps": eps, "n_queries": queries},
             "free", r, near),
    ]
    if no_grad and r == 1:
        out.append(Rung("spsa", "spsa", {"eps": eps, "iterations": s.spsa_iterations, "n_samples": s.spsa_samples},
                        scope="no-gradient"))
    return out


def _targeted(s: LadderSpec, eps: float, r: int) -> Dict[str, Any]:
    """Round 1: the short sweep over every ranked candidate; round r >= 2: the next ``targets`` ranks, deep."""
    if r == 1:
        return {"eps": eps, "steps": s.sweep_steps, "targets": s.pool, "first": 1, "pool": s.pool}
    return {"eps": eps, "steps": s.steps, "targets": s.targets, "first": (r - 2) * s.targets + 1, "pool": s.pool}


@dataclass
class RungResult:
    """What one rung did to the samples it attacked: top-1 correct after it, passes, the points it returned and,
    where the attack reports it, each sample's best margin loss (higher = nearer the boundary)."""

    still: torch.Tensor
    forward: torch.Tensor
    backward: torch.Tensor
    x_adv: Optional[torch.Tensor] = None
    nearness: Optional[torch.Tensor] = None


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
    status: str = ""
    detail: str = ""

    def __post_init__(self) -> None:
        if not self.broken_by:
            self.broken_by = [""] * len(self.robust)
        for kind in ("gradient", "free"):
            self.nearness.setdefault(kind, torch.full((len(self.robust),), float("-inf")))

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
        self.history.append({"id": rung.id, "attacked": int(len(idx)), "broke": int(len(broke)),
                             "full": rung.scope == "robust", "label": rung.attack, "round": rung.round,
                             "family": rung.family, "scope": rung.scope, "settings": rung.describe()})
        return int(len(broke))

    def misled(self) -> torch.Tensor:
        """Mask of the still-robust samples on which Square came at least as near the boundary as the gradient
        families (the same scale-free DLR margin): a short random search matching 100-iteration gradient attacks
        says their gradients mislead there, so only the gradient-free search is evidence about them."""
        free, grad = self.nearness["free"], self.nearness["gradient"]
        return self.robust & torch.isfinite(free) & (free >= grad)

    def near(self, share: float, least: int, by: str = "gradient") -> torch.Tensor:
        """Mask of the still-robust samples nearest the boundary by ``by``'s evidence: the ``share`` (at least
        ``least``) with the highest nearness; ties and samples without a nearness keep sample order. Where that kind
        has no evidence on any still-robust sample, the other kind's."""
        rob = self.robust.nonzero().squeeze(1)
        k = min(len(rob), max(int(least), math.ceil(share * len(rob))))
        score = self.nearness[by][rob]
        if len(rob) and not bool(torch.isfinite(score).any()):
            score = self.nearness["free" if by == "gradient" else "gradient"][rob]
        order = torch.sort(score, descending=True, stable=True).indices
        mask = torch.zeros_like(self.robust)
        mask[rob[order[:k]]] = True
        return mask


RunAttack = Callable[[Rung, torch.Tensor], RungResult]


def climb(ladder: Ladder, spec: LadderSpec, eps: float, run: RunAttack, *, unstable: bool, no_grad: torch.Tensor,
          batch_dependent: bool = False) -> Ladder:
    """Run the rounds after rung 0 on ``ladder`` until the stop rule holds (see the module docstring).

    ``run(rung, idx)``: the rung's :class:`RungResult` for samples ``idx``."""
    n = len(ladder.robust)
    tol = spec.tolerance(n)
    no_grad = no_grad.cpu()
    gradients_missing = int((no_grad & ladder.robust).sum()) > tol
    rounds: List[Tuple[int, int, set]] = []  # (round, broke, families that ran)
    queries, square_broke = spec.square_queries, False
    for r in range(1, spec.rounds + 1):
        if not ladder.robust.any():
            break
        if r == 2 or (r > 2 and square_broke):  # more search only where the search still breaks samples
            queries *= spec.square_growth
        # a later round's scopes are fixed at its start (by each kind's evidence so far), so its rungs share them
        scopes = {by: ladder.robust.clone() if r == 1 else ladder.near(spec.near_share, spec.near_min, by)
                  for by in ("gradient", "free")}
        if r > 1:  # and every sample on which the gradient families did no better than a short random search
            scopes["free"] |= ladder.misled()
        broke_round, families, square_broke = 0, set(), False
        for rung in planned_round(spec, eps, r, unstable, bool((no_grad & ladder.robust).any()), queries):
            mask = ladder.robust & (no_grad if rung.scope == "no-gradient" else scopes[rung.near_by])
            idx = mask.nonzero().squeeze(1)
            if len(idx):
                res = run(rung, idx)
                ladder.charge(rung.id, idx, res.forward, res.backward)
                broke = ladder.record(rung, idx, res)
            else:
                broke = ladder.record(rung, idx, RungResult(torch.ones(0, dtype=torch.bool), torch.zeros(0),
                                                            torch.zeros(0)))
            broke_round += broke
            square_broke |= rung.family == "free" and broke > 0
            if rung.family:
                families.add(rung.family)
        rounds.append((r, broke_round, families))
        if broke_round <= tol and families >= set(FAMILIES):
            break
    ladder.status, ladder.detail = verdict(ladder, spec, tol, rounds, gradients_missing, int(no_grad.sum()),
                                           batch_dependent)
    return ladder


def verdict(ladder: Ladder, spec: LadderSpec, tol: int, rounds: List[Tuple[int, int, set]], gradients_missing: bool,
            n_no_grad: int, batch_dependent: bool = False) -> Tuple[str, str]:
    """(status, one-line detail) of a finished ladder."""
    if gradients_missing:
        return UPPER_BOUND, (f"input gradients are zero or not finite for both CE and DLR losses on {n_no_grad} "
                             f"sample(s); only gradient-free rungs could attack them, so the robust accuracy is only an "
                             f"upper bound")
    if batch_dependent:
        return BATCH_DEPENDENT, ("the model's outputs for a sample change with the other samples in its batch (a "
                                 "batch-level statistic, or BatchNorm left in training mode), so a verdict scored in one "
                                 "batch need not hold in another: no robust accuracy can be called converged")
    if not rounds:
        if not ladder.robust.any():
            return _reduced(spec, CONVERGED), "no sample is left robust after your attack"
        return NOT_CONVERGED, "no round ran"
    r, broke, families = rounds[-1]
    if not ladder.robust.any():
        return _reduced(spec, CONVERGED), (f"no sample is left robust (round {r} broke the last {broke})" if broke else
                                           "no sample is left robust")
    if broke <= tol and families >= set(FAMILIES):
        status = _reduced(spec, CONVERGED)
        return status, (f"round {r} ({'every still-robust sample' if r == 1 else 'the nearest still-robust samples'}"
                        f": ranked APGD-T, APGD-CE, FAB-T, Square) broke {broke} sample(s) (tolerance {tol})")
    return NOT_CONVERGED, (f"round {r}, the last ({spec.rounds} allowed), still broke {broke} sample(s) (tolerance "
                           f"{tol}): raise --converge-opt rounds, or report the number as an upper bound")


def _reduced(spec: LadderSpec, status: str) -> str:
    cut = spec.reductions()
    return f"{REDUCED} ({', '.join(cut)})" if cut and status == CONVERGED else status


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
             report: Optional[Callable[[int, int, int], None]] = None) -> RungResult:
    """Run ``rung``'s attack on (x, y) in batches: its :class:`RungResult`, the verdict pass included in the
    forward count. ``check(tensor, stage)`` sees every adversarial batch ("attack") and its logits ("verdict"),
    and raises on NaN/inf (default: :func:`finite_or_stop`); ``report(done, total, broken)`` hears after each batch
    (the progress line)."""
    check = check or finite_or_stop(rung)
    attack = make_attack(rung.attack, **rung.params)
    still, fwd, bwd, adv, near = [], [], [], [], []
    for s in range(0, len(x), max(1, batch_size)):
        xb, yb = x[s:s + batch_size], y[s:s + batch_size]
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
        if report is not None:
            report(min(s + batch_size, len(x)), len(x), int(sum(int((~t).sum()) for t in still)))
    return RungResult(torch.cat(still), torch.cat(fwd), torch.cat(bwd), torch.cat(adv), torch.cat(near))
