"""The convergence ladder: escalate attacks on the samples still robust until a full rung breaks
(almost) nothing more, and say which kind of number came out.

Why a ladder and not one strong attack: on the embedded models PGD-20 and even PGD-500 leave 20 points
of robust accuracy that AutoAttack's other components break (docs/attacks.md), while running every
strong attack on every sample wastes passes on samples an earlier attack already broke. Each rung runs
only on the samples still robust (top-1) after the rungs before it; the per-sample worst case over the
rungs is the converged verdict.

Order (canonical, ``RUNG_ORDER``): the user's attack(s) (rung 0); APGD-CE and APGD-DLR with EOT when
repeated clean forward passes disagree (a randomised model); APGD-CE; APGD-T (targeted DLR); APGD-CE
with more restarts on the samples rung 0 left with a loss still rising (incomplete optimisation);
FAB-T; Square; SPSA on samples whose input gradients are unavailable; a last stronger APGD on
everything still robust when the ladder has not converged by then.

Stop rule: after a full rung (one run on every still-robust sample) that breaks at most
``tolerance(n)`` = max(tol_min, floor(tol_share * n)) samples, stop, but never before one CE-loss and
one DLR-loss gradient rung have run (CE saturates when logits are scaled up; DLR does not). When the
input gradients of more than ``tolerance(n)`` samples are zero or not finite for both losses, the
gradient-free rungs (Square, SPSA) always run and the status is ``upper bound: gradients unavailable``:
a gradient-free search failing is no evidence of robustness. The rule is applied per work unit (a chunk
of ``--chunk-size`` samples), so sharding never changes a verdict; a condition is ``converged`` only if
every chunk is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F

from ..attacks import make_attack
from ..errors import UserError
from ..runtime.health import NonFiniteError

from ..results.summaries.converge import CONVERGED, NOT_CONVERGED, RUNG_ORDER, STATUSES, UPPER_BOUND  # noqa: F401

PROBE = "probe"  # passes spent on the instability and gradient probes
MAX_TOL_SHARE, MAX_TOL_MIN = 0.05, 10  # the loosest stop rule accepted: 5% of a unit's samples, 10 samples


@dataclass(frozen=True)
class LadderSpec:
    """The ladder's settings (``--converge-tol``, ``--converge-opt KEY=VALUE``); part of the unit key."""

    tol_share: float = 0.001  # stop when a full rung breaks at most this share of the samples ...
    tol_min: int = 1  # ... or this many, whichever is larger
    steps: int = 100  # APGD-CE / APGD-T iterations (AutoAttack standard)
    targets: int = 9  # APGD-T / FAB-T target classes
    fab_steps: int = 100
    square_queries: int = 5000
    eot_steps: int = 100
    eot_iter: int = 20  # AutoAttack's rand version
    strong_steps: int = 100  # the stronger APGD: 5 restarts of AutoAttack's 100 iterations
    strong_restarts: int = 5
    spsa_iterations: int = 40  # SPSA runs only on samples without usable gradients
    spsa_samples: int = 128
    unstable_rtol: float = 1e-3  # repeated clean logits differing by more than this (relative): randomised

    @classmethod
    def from_options(cls, options: Optional[Mapping[str, Any]]) -> "LadderSpec":
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
            except (TypeError, ValueError):
                raise UserError(f"--converge-opt {k}={v!r}: expected a {'number' if want is float else 'whole number'}")
        spec = cls(**clean)
        spec.check()
        return spec

    def check(self) -> None:
        # a ladder whose last rung may still break more than this is not converged in any useful sense
        if not (0 <= self.tol_share <= MAX_TOL_SHARE) or not math.isfinite(self.tol_share):
            raise UserError(f"--converge-tol must be a share in [0, {MAX_TOL_SHARE}] (0.001 = 0.1%), got "
                            f"{self.tol_share}")
        if not 0 <= self.tol_min <= MAX_TOL_MIN:
            raise UserError(f"--converge-opt tol_min must be in [0, {MAX_TOL_MIN}] samples, got {self.tol_min} (for "
                            f"a larger tolerance on large work units, raise --converge-tol, a share)")
        if not (math.isfinite(self.unstable_rtol) and self.unstable_rtol >= 0):
            raise UserError(f"--converge-opt unstable_rtol must be a finite number >= 0, got {self.unstable_rtol}")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name not in ("tol_share", "tol_min", "unstable_rtol") and v < 1:
                raise UserError(f"--converge-opt {f.name} must be >= 1, got {v}")

    def tolerance(self, n: int) -> int:
        """How many samples a full rung may still break for the ladder to count as converged."""
        return max(int(self.tol_min), int(math.floor(self.tol_share * n + 1e-9)))

    def as_dict(self) -> Dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class Rung:
    """One rung: an attack with settings, run on ``scope`` (all still-robust samples, or a subset)."""

    id: str
    attack: str
    params: Dict[str, Any]
    scope: str = "robust"  # robust | flagged | no-gradient
    loss: str = ""  # "ce" / "dlr": what the minimum set needs; "" for others


def planned_rungs(spec: LadderSpec, eps: float, unstable: bool, flagged: bool, no_grad: bool) -> List[Rung]:
    """The rungs after rung 0, in canonical order, with the evidence-driven ones where called for."""
    s = spec
    out: List[Rung] = []
    if unstable:
        out += [Rung("eot-ce", "apgd_eot", {"eps": eps, "steps": s.eot_steps, "eot_iter": s.eot_iter, "loss": "ce"},
                     loss="ce"),
                Rung("eot-dlr", "apgd_eot", {"eps": eps, "steps": s.eot_steps, "eot_iter": s.eot_iter, "loss": "dlr"},
                     loss="dlr")]
    out.append(Rung("apgd-ce", "apgd_ce", {"eps": eps, "steps": s.steps}, loss="ce"))
    out.append(Rung("apgd-t", "apgd_t", {"eps": eps, "steps": s.steps, "targets": s.targets}, loss="dlr"))
    if flagged:  # after APGD-T: the flagged samples it breaks cost the stronger rung nothing
        out.append(Rung("strong-flagged", "apgd_strong", {"eps": eps, "steps": s.strong_steps,
                                                          "restarts": s.strong_restarts}, scope="flagged"))
    out.append(Rung("fab-t", "fab_t", {"eps": eps, "steps": s.fab_steps, "targets": s.targets}))
    out.append(Rung("square", "square", {"eps": eps, "n_queries": s.square_queries}))
    if no_grad:
        out.append(Rung("spsa", "spsa", {"eps": eps, "iterations": s.spsa_iterations, "n_samples": s.spsa_samples},
                        scope="no-gradient"))
    return out


def strong_all(spec: LadderSpec, eps: float) -> Rung:
    """The last escalation: more restarts and iterations (DLR loss, scale-invariant) on every sample left."""
    return Rung("strong-all", "apgd_strong", {"eps": eps, "steps": spec.strong_steps,
                                              "restarts": spec.strong_restarts, "loss": "dlr"}, loss="dlr")


@dataclass
class Ladder:
    """The per-sample state of one chunk's ladder: robust now, which rung broke it, passes per rung."""

    robust: torch.Tensor  # bool, top-1 correct under every rung so far (and clean)
    broken_by: List[str] = field(default_factory=list)  # rung id or "" per sample
    forward: Dict[str, torch.Tensor] = field(default_factory=dict)  # rung id -> forward images per sample
    backward: Dict[str, torch.Tensor] = field(default_factory=dict)
    history: List[Dict[str, Any]] = field(default_factory=list)  # per rung: id, attacked, broke, full
    status: str = ""
    detail: str = ""

    def __post_init__(self) -> None:
        if not self.broken_by:
            self.broken_by = [""] * len(self.robust)

    def charge(self, rung: str, idx: torch.Tensor, fwd: torch.Tensor, bwd: torch.Tensor) -> None:
        n = len(self.robust)
        for store, v in ((self.forward, fwd), (self.backward, bwd)):
            t = store.setdefault(rung, torch.zeros(n, dtype=torch.float64))
            t[idx.cpu()] += v.detach().double().cpu()

    def record(self, rung: Rung, idx: torch.Tensor, still: torch.Tensor) -> int:
        """Apply a rung's verdicts (``still``: top-1 correct after it, per attacked sample)."""
        broke = idx[~still.to(idx.device)]
        for i in broke.tolist():
            self.broken_by[i] = rung.id
        self.robust[broke] = False
        self.history.append({"id": rung.id, "attacked": int(len(idx)), "broke": int(len(broke)),
                             "full": rung.scope == "robust", "label": rung.attack})
        return int(len(broke))


RunAttack = Callable[[Rung, torch.Tensor], Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def climb(ladder: Ladder, spec: LadderSpec, eps: float, run: RunAttack, *, unstable: bool, flagged: torch.Tensor,
          no_grad: torch.Tensor) -> Ladder:
    """Run the rungs after rung 0 on ``ladder`` until the stop rule holds (see the module docstring).

    ``run(rung, idx)``: (top-1 correct after the rung, forward, backward passes) for samples ``idx``."""
    n = len(ladder.robust)
    tol = spec.tolerance(n)
    gradients_missing = int((no_grad & ladder.robust.to(no_grad.device)).sum()) > tol
    rungs = planned_rungs(spec, eps, unstable, bool((flagged & ladder.robust.to(flagged.device)).any()),
                          bool(no_grad.any()))
    losses_done: set = set()
    free_done = False
    last_full: Optional[Tuple[str, int]] = None
    i = 0
    escalated = False
    while True:
        if i == len(rungs):
            if last_full is not None and last_full[1] > tol and not escalated and ladder.robust.any():
                rungs.append(strong_all(spec, eps))
                escalated = True
            else:
                break
        rung = rungs[i]
        i += 1
        mask = ladder.robust.clone()
        if rung.scope == "flagged":
            mask &= flagged.cpu()
        elif rung.scope == "no-gradient":
            mask &= no_grad.cpu()
        idx = mask.nonzero().squeeze(1)
        if len(idx):
            still, fwd, bwd = run(rung, idx)
            ladder.charge(rung.id, idx, fwd, bwd)
            broke = ladder.record(rung, idx, still)
        else:
            broke = ladder.record(rung, idx, torch.ones(0, dtype=torch.bool))
        if rung.loss:
            losses_done.add(rung.loss)
        if rung.id in ("square", "spsa"):
            free_done = rung.id == "spsa" or not no_grad.any()
        if rung.scope != "robust":
            continue
        last_full = (rung.id, broke)
        if not ladder.robust.any():
            break
        minimum = {"ce", "dlr"} <= losses_done and (free_done or not gradients_missing)
        if minimum and broke <= tol:
            break
    ladder.status, ladder.detail = verdict(ladder, tol, last_full, gradients_missing, int(no_grad.sum()))
    return ladder


def verdict(ladder: Ladder, tol: int, last_full: Optional[Tuple[str, int]], gradients_missing: bool,
            n_no_grad: int) -> Tuple[str, str]:
    """(status, one-line detail) of a finished ladder."""
    if gradients_missing:
        return UPPER_BOUND, (f"input gradients are zero or not finite for both CE and DLR losses on {n_no_grad} "
                             f"sample(s); only gradient-free rungs could attack them, so the robust accuracy is only an "
                             f"upper bound")
    if last_full is None:
        return NOT_CONVERGED, "no full rung ran"
    rid, broke = last_full
    if not ladder.robust.any():  # nothing left for a further rung to break
        return CONVERGED, "no sample is left robust" + (f" (the last, {rid}, broke {broke})" if broke else "")
    if broke <= tol:
        return CONVERGED, f"the last full rung ({rid}) broke {broke} sample(s) (tolerance {tol})"
    return NOT_CONVERGED, f"the last rung ({rid}) still broke {broke} sample(s) (tolerance {tol})"


def dlr_losses(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per sample -(z_y - max_{j != y} z_j) / (z_(1) - z_(3)): the DLR loss, invariant to shifting and
    scaling the logits (Croce & Hein 2020), higher = more adversarial."""
    z = logits.float()
    top = z.sort(1, descending=True).values
    z_y = z.gather(1, y[:, None]).squeeze(1)
    other = z.masked_fill(F.one_hot(y, z.shape[1]).bool(), float("-inf")).amax(1)
    third = top[:, min(2, z.shape[1] - 1)]
    return -(z_y - other) / (top[:, 0] - third + 1e-12)


def gradients_unavailable(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per sample: are the input gradients of both the CE and the DLR loss zero or not finite at x?
    One forward and two backward passes. CE alone would call a model with scaled-up logits gradient-free."""
    x = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        logits = model(x).float()
        (g_ce,) = torch.autograd.grad(F.cross_entropy(logits, y, reduction="none").sum(), x, retain_graph=True,
                                      allow_unused=True)
        (g_dlr,) = torch.autograd.grad(dlr_losses(logits, y).sum(), x, allow_unused=True)

    def bad(g: Optional[torch.Tensor]) -> torch.Tensor:
        if g is None:
            return torch.ones(len(x), dtype=torch.bool, device=x.device)
        g = g.flatten(1)
        return ~(g.abs().amax(1) > 0) | ~torch.isfinite(g).all(1)

    return bad(g_ce) & bad(g_dlr)


def predictions_unstable(model: torch.nn.Module, x: torch.Tensor, logits: torch.Tensor, rtol: float,
                         draws: int = 2) -> bool:
    """Do repeated clean forward passes disagree (argmax, or logits beyond ``rtol`` of their scale)?
    A randomised model (dropout left on, random transforms) needs expectation over transformation."""
    scale = float(logits.abs().max()) + 1e-12
    with torch.no_grad():
        for _ in range(draws):
            again = model(x).float()
            if (again.argmax(1) != logits.argmax(1)).any() or float((again - logits).abs().max()) > rtol * scale:
                return True
    return False


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
             generator: torch.Generator, batch_size: int, trace: bool = False, check: Optional[Check] = None
             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run ``rung``'s attack on (x, y) in batches: (top-1 correct after it, forward, backward passes),
    the verdict pass included in the forward count. ``check(tensor, stage)`` sees every adversarial batch
    ("attack") and its logits ("verdict"), and raises on NaN/inf (default: :func:`finite_or_stop`)."""
    check = check or finite_or_stop(rung)
    attack = make_attack(rung.attack, **rung.params)
    still, fwd, bwd = [], [], []
    for s in range(0, len(x), max(1, batch_size)):
        xb, yb = x[s:s + batch_size], y[s:s + batch_size]
        x_adv = attack(model, xb, yb, bounds=(0.0, 1.0), generator=generator, trace=trace)
        check(x_adv, "attack")
        with torch.no_grad():
            logits = verdict_model(x_adv).float()
        check(logits, "verdict")
        still.append(logits.argmax(1) == yb)
        tel = attack.telemetry
        zeros = torch.zeros(len(xb), device=xb.device)
        fwd.append((tel.forward if tel is not None else zeros) + 1)
        bwd.append(tel.backward if tel is not None else zeros)
    return torch.cat(still), torch.cat(fwd), torch.cat(bwd)
