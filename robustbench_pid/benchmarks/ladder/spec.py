"""The ladder's settings (``--converge-tol``, ``--converge-opt KEY=VALUE``): one frozen dataclass, part of every
converge unit's key, so another setting is another condition and a run folder is never resumed with other ones.

Why these defaults: the full budgets are AutoAttack standard's per family (APGD-CE 100 iterations, APGD-T and FAB-T
9 targets x 100, Square 5,000 queries); round 1's small budgets and ``near`` were chosen on the design grid
(docs/attacks.md), where round 1 and the first near round fit the cost criteria; ``edge``, a quarter of tau's start,
on the same grid (design 13, from design 12's records: the samples it left above AutoAttack had been left within a
fraction of a percent of their clean margin, and few samples a cell lay within 1/64)."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Optional

from ...errors import UserError
from ...results.summaries.stop_rule import tolerance

MAX_TOL_SHARE, MAX_TOL_MIN = 0.05, 10  # the loosest stop rule accepted: 5% of a unit's samples, 10 samples
_NOT_BUDGETS = ("tol_share", "near", "tol_min", "edge")  # shares, and a count that may be 0: checked on their own


@dataclass(frozen=True)
class LadderSpec:
    """The ladder's settings; the package docstring states the rule they enter."""

    tol_share: float = 0.001  # the last round may break at most this share of the samples ...
    tol_min: int = 0  # ... or this many, whichever is larger (0: the share alone, design 12)
    near: float = 0.0625  # tau's start: near = at most this share of the clean verdict margin left (doubles)
    edge: float = 0.015625  # a kind that left a sample within this share restarts there (stop_rule.FRESH; 0: never)
    steps: int = 100  # APGD-CE's iterations; APGD-T's and FAB-T's per target in the full budget (AutoAttack)
    pool: int = 9  # ranked target classes: round 1's sweep and the full budget (AutoAttack's 9)
    sweep_steps: int = 12  # round 1's APGD-T: every ranked target, this many iterations each
    square_queries: int = 500  # round 1's Square ...
    square_budget: int = 5000  # ... continued to this many queries in the full budget (AutoAttack's 5,000)
    eot_iter: int = 20  # a randomised model's EOT rungs: gradient draws per step (AutoAttack's rand version)
    spsa_iterations: int = 40  # SPSA runs only on samples without usable gradients
    spsa_samples: int = 128

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
        if not (math.isfinite(self.near) and 0 < self.near <= 1):
            raise UserError(f"--converge-opt near must be a share of the clean margin in (0, 1], got {self.near}")
        if not (math.isfinite(self.edge) and 0 <= self.edge < 1):
            raise UserError(f"--converge-opt edge must be a share of the clean margin in [0, 1), got {self.edge} (0: no "
                            f"fresh starts)")
        for f in fields(self):
            if f.name not in _NOT_BUDGETS and getattr(self, f.name) < 1:
                raise UserError(f"--converge-opt {f.name} must be >= 1, got {getattr(self, f.name)}")
        if self.square_budget < self.square_queries:
            raise UserError(f"--converge-opt square_budget ({self.square_budget}) must be at least square_queries "
                            f"({self.square_queries}): the full budget continues round 1's search")

    def tolerance(self, n: int) -> int:
        """How many samples the last round may still break for the ladder to count as converged."""
        return tolerance(n, self.tol_share, self.tol_min)

    def as_dict(self) -> Dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def reductions(self) -> List[str]:
        """The settings weaker than the defaults ('steps 25 < 100'): a ladder with any is a reduced ladder,
        whose ``converged`` says so."""
        base = LadderSpec()
        out = []
        for f in fields(self):
            v, d = getattr(self, f.name), getattr(base, f.name)
            looser = v > d if f.name in ("tol_share", "tol_min") else v < d
            if looser:
                out.append(f"{f.name} {v:g} {'>' if v > d else '<'} {d:g}")
        return out
