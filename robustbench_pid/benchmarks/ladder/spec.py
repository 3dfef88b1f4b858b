"""The ladder's settings (``--converge-tol``, ``--converge-opt KEY=VALUE``): one frozen dataclass, part of every
converge unit's key, so another setting is another condition and a run folder is never resumed with other ones.

Why these defaults: docs/attacks.md's grid measures them against AutoAttack and a stronger reference; the caps are
AutoAttack's own budgets per family (a family still closing in on a sample at its cap ends ``not converged``)."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Optional

from ...errors import UserError

MAX_TOL_SHARE, MAX_TOL_MIN = 0.05, 10  # the loosest stop rule accepted: 5% of a unit's samples, 10 samples
# settings that are thresholds or shares rather than budgets (validated on their own, not as whole numbers >= 1)
_NOT_BUDGETS = ("tol_share", "tol_min", "unstable_rtol", "batch_rtol", "near_share", "lookahead", "near_miss", "edge")
_COUNTS = ("continue_rounds", "near_tries", "edge_tries")  # budgets that may be 0 (none of it)


@dataclass(frozen=True)
class LadderSpec:
    """The ladder's settings; see the package docstring for what each rung and round does."""

    tol_share: float = 0.001  # stop when a round breaks at most this share of the samples ...
    tol_min: int = 1  # ... or this many, whichever is larger
    steps: int = 100  # APGD-CE and deep APGD-T iterations per run (AutoAttack standard)
    pool: int = 9  # candidate classes the ranking scores (the highest logits besides the true one)
    sweep_steps: int = 12  # round 1's APGD-T: every ranked candidate, this many iterations each
    targets: int = 3  # rounds >= 2: this many ranked targets at ``steps`` each (round r: ranks (r-2)*targets+1 ...)
    fab_steps: int = 50
    fab_targets: int = 1  # FAB-T targets per round (round r: the next ones by logit)
    square_queries: int = 500  # Square's queries in round 1 ...
    square_growth: int = 2  # ... each later run continues a sample's search to this times its queries (1,000, 2,000 ..)
    rounds: int = 3  # rounds driven by breaks (round r >= 2 runs when round r - 1 broke more than the tolerance)
    continue_rounds: int = 4  # further rounds, only for the families still closing in on a sample (exhaustion)
    lookahead: float = 4.0  # still closing in: the margin left <= lookahead x what the run's last half gained
    near_miss: float = 0.1  # a gradient search that stalled with at most this share of the clean margin left ...
    near_tries: int = 1  # ... gets this many more APGD-T starts on the class it came nearest on
    edge: float = 0.01  # one that stalled with at most this share left is on the boundary's edge ...
    edge_tries: int = 6  # ... and gets this many more starts there, a round's ``targets`` at a time, past the cap
    cap_targeted: int = 900  # per sample, backward passes of APGD-T (AutoAttack: 9 targets x 100)
    cap_ce: int = 300  # per sample, backward passes of APGD-CE (three runs of AutoAttack's 100)
    cap_boundary: int = 900  # per sample, backward passes of FAB-T (AutoAttack: 9 targets x 100)
    cap_free: int = 5000  # per sample, Square's queries (AutoAttack's 5,000)
    near_share: float = 0.2  # rounds >= 2 attack this share of the still-robust samples, nearest first ...
    near_min: int = 8  # ... and at least this many
    eot_steps: int = 100
    eot_iter: int = 20  # AutoAttack's rand version
    spsa_iterations: int = 40  # SPSA runs only on samples without usable gradients
    spsa_samples: int = 128
    unstable_rtol: float = 1e-3  # repeated clean logits (or input gradients) differing by more than this: random
    batch_rtol: float = 1e-2  # a sample's logits alone vs in its batch differing by more (beyond the noise): batch-dependent

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
        for name in ("unstable_rtol", "batch_rtol", "lookahead", "near_miss", "edge"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise UserError(f"--converge-opt {name} must be a finite number >= 0, got {v}")
        if not (math.isfinite(self.near_share) and 0 < self.near_share <= 1):
            raise UserError(f"--converge-opt near_share must be a share in (0, 1], got {self.near_share}")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name not in _NOT_BUDGETS + _COUNTS and v < 1:
                raise UserError(f"--converge-opt {f.name} must be >= 1, got {v}")
        for name in _COUNTS:
            if getattr(self, name) < 0:
                raise UserError(f"--converge-opt {name} must be >= 0, got {getattr(self, name)}")
        if (self.rounds - 1) * self.targets > self.pool:
            need = (self.rounds - 1) * self.targets
            raise UserError(f"--converge-opt: {self.rounds - 1} deep rounds of {self.targets} ranked targets need "
                            f"{need} candidates but pool is {self.pool}; raise pool or lower rounds/targets")
        from ...results.summaries.converge import MAX_ROUNDS

        if self.rounds + self.continue_rounds > MAX_ROUNDS:
            raise UserError(f"--converge-opt: rounds + continue_rounds must be at most {MAX_ROUNDS}, got "
                            f"{self.rounds} + {self.continue_rounds}")

    def tolerance(self, n: int) -> int:
        """How many samples a round may still break for the ladder to count as converged."""
        return max(int(self.tol_min), int(math.floor(self.tol_share * n + 1e-9)))

    def square_new(self, r: int) -> int:
        """The most new queries Square's run in round ``r`` has: round 1 ``square_queries``; each later run
        continues a sample's search from its best point to ``square_growth`` times the queries it had done (500, then
        500 more, 1,000 more ...: the same totals as fresh runs of 1,000, 2,000 ... without repeating their starts)."""
        return int(self.square_queries * self.square_growth ** max(0, r - 2) * (1 if r == 1 else self.square_growth - 1))

    def cap(self, family: str) -> float:
        """A family's budget per sample (backward passes; Square: queries), AutoAttack's for that family at least."""
        return float({"targeted": self.cap_targeted, "ce": self.cap_ce, "boundary": self.cap_boundary,
                      "free": self.cap_free}.get(family, math.inf))

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
