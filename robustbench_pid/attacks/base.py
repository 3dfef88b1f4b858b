"""The attack base class: settings as dataclass fields, a seeded ``__call__``, fp32 input gradients.

Conventions every attack follows (and the runner relies on):
- ``x`` is a float batch; ``bounds`` is the valid range to clip to (``(0, 1)`` in pixel space) or
  ``None`` (the ``paper`` protocol: normalized tensors, no clipping).
- Gradients are taken with ``torch.autograd.grad(loss, x)`` on a model whose parameters do not
  require grad; no ``.backward()``, no parameter gradients.
- Randomness comes from the ``generator`` passed in (the runner seeds it per work unit), never
  from the global RNG, and is drawn through :func:`draw` on the generator's device (the runner's is a
  CPU generator) and then moved to the batch's device, so a CPU and a GPU run draw the same numbers.
- ``stats`` is filled during a call with per-sample diagnostics (e.g. ``grad_zero``), on the
  batch's device (copying them to the host mid-attack would stall the device).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Iterator, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ..core.labels import number
from ..errors import UserError
from .telemetry import ENABLED as _TELEMETRY_ON
from .telemetry import Telemetry

Bounds = Optional[Tuple[float, float]]


@dataclass
class Attack:
    """Base class. Subclasses set ``name``, ``norm`` and implement ``perturb``."""

    name: ClassVar[str] = "attack"
    norm: ClassVar[str] = "linf"  # linf, l2, l1 or none (the unit of eps)
    uses_gradients: ClassVar[bool] = True
    # True: robust iff clean AND adversarial are correct (a worst case over the ball, which contains x).
    # False: plain accuracy on the transformed inputs (random noise is not a worst case).
    worst_case: ClassVar[bool] = True
    eps_max: ClassVar[float] = 1.0  # largest sensible eps in pixel units (L-inf); others override
    label: ClassVar[str] = ""  # short display name (FGSM, PGD, ...); the registered name upper-cased if empty
    # settings that change speed or memory but never a result: left out of a condition's identity
    not_identity: ClassVar[Tuple[str, ...]] = ()
    paper_eps: ClassVar[Optional[float]] = None  # the eps the PIDformer / RPC papers report, if they ran it
    loss_kind: ClassVar[str] = "ce"  # the telemetry loss (attacks/telemetry.py): "ce" or "margin"

    eps: float = 3 / 255
    stats: Dict[str, torch.Tensor] = field(default_factory=dict, init=False, repr=False, compare=False)
    # per-sample passes, iterations and losses of the last call (attacks/telemetry.py); not a setting
    telemetry: Optional[Telemetry] = field(default=None, init=False, repr=False, compare=False)
    # keep each sample's first point the walk saw broken at top-1 (``note_first_break``); not a setting
    keep_first_break: bool = field(default=False, init=False, repr=False, compare=False)

    # --- construction ---------------------------------------------------------------------
    @classmethod
    def param_names(cls) -> Tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)

    @classmethod
    def from_params(cls, params: Mapping[str, Any], where: str = "") -> "Attack":
        names = cls.param_names()
        unknown = [k for k in params if k not in names]
        loc = f"{where}: " if where else ""
        if unknown:
            raise UserError(f"{loc}unknown setting(s) {', '.join(map(repr, unknown))} for attack {cls.name!r}; "
                            f"valid settings: {', '.join(names)}")
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        clean: Dict[str, Any] = {}
        for k, v in params.items():
            clean[k] = _coerce(cls.name, k, v, types[k], loc)
        obj = cls(**clean)
        obj.validate(loc)
        return obj

    def validate(self, loc: str = "") -> None:
        if not (0 <= self.eps) or not math.isfinite(self.eps):
            raise UserError(f"{loc}attack {self.name!r}: eps must be >= 0, got {self.eps}")
        if self.eps == 0:
            raise UserError(f"{loc}attack {self.name!r}: eps must be > 0, got 0: with eps 0 the attack leaves every "
                            f"image as it is and its row would just repeat clean accuracy (reported anyway). Give "
                            f"eps > 0 (--eps 1/255), or drop the attack")
        if self.eps > self.eps_max:
            raise UserError(f"{loc}attack {self.name!r}: eps {self.eps} exceeds {self.eps_max} "
                            f"({self.norm} bound for images in [0, 1]); did you mean {self.eps:g}/255?")
        step = getattr(self, "step_size", None)
        if isinstance(step, float) and step > self.eps_max:
            raise UserError(f"{loc}attack {self.name!r}: step_size {step:g} exceeds {self.eps_max:g} ({self.norm} bound "
                            f"for images in [0, 1]); did you mean {step:g}/255?")
        if getattr(self, "step_size", None) is not None and getattr(self, "step_size_factor", None) is not None:
            raise UserError(f"{loc}attack {self.name!r}: step_size and step_size_factor both given; the step is one "
                            f"of them (--step-size S, or --param step_size_factor=F for F x eps): give one")
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in COUNTS and isinstance(v, int) and v < 1:
                raise UserError(f"{loc}attack {self.name!r}: {f.name} must be >= 1, got {v}: with no {f.name} the "
                                f"attack leaves every image as it is and its row would just repeat clean accuracy. "
                                f"Give {f.name} >= 1 ({'--steps N' if f.name == 'steps' else f'--param {f.name}=N'}), or drop the "
                                f"attack")
            if f.name == "rho" and not 0 < v < 1:
                raise UserError(f"{loc}attack {self.name!r}: rho (APGD's step-size checkpoint share) must be in (0, 1), "
                                f"got {v:g} (--param rho=0.75, AutoAttack's)")
            if f.name in POSITIVE and v is not None and not v > 0:
                flag = "--step-size" if f.name == "step_size" else f"--param {f.name}"
                raise UserError(f"{loc}attack {self.name!r}: setting {f.name!r} must be a positive number (> 0), got {v:g} "
                                f"({flag})")
            if f.name == "stop_topk" and isinstance(v, int) and v < 1:
                raise UserError(f"{loc}attack {self.name!r}: stop_topk must be >= 1, got {v}")

    def params(self) -> Dict[str, Any]:
        return {n: getattr(self, n) for n in self.param_names()}

    def with_params(self, **kw: Any) -> "Attack":
        return type(self).from_params({**self.params(), **kw})

    # --- identity ------------------------------------------------------------------------
    @classmethod
    def display_name(cls) -> str:
        return cls.label or cls.name.upper()

    @classmethod
    def label_for(cls, params: Mapping[str, Any]) -> str:
        """Generic label: the name and every setting but eps (attacks override ``describe``)."""
        rest = [f"{k} {_show(v)}" for k, v in sorted(params.items()) if k != "eps" and k not in cls.not_identity]
        return cls.display_name() + (f" ({', '.join(rest)})" if rest else "")

    def describe(self) -> str:
        """A readable label of the settings that change results, e.g. ``PGD-20 (step 2.5·eps/20, ...)``."""
        return self.label_for(self.params())

    def passes(self) -> Tuple[float, float]:
        """(forward-only, forward+backward) passes per sample if every sample is attacked to the
        end (early stopping lowers it): ``restarts`` x ``steps`` gradient passes, or for a
        gradient-free attack ``restarts`` x ``iterations`` x ``n_samples`` forward passes.
        Attacks whose cost has another shape override it."""
        p = self.params()
        restarts = max(1, int(p.get("restarts", 1) or 1))
        steps = p.get("steps", p.get("iterations"))
        if not self.uses_gradients:
            return float(restarts * int(steps or 0) * max(1, int(p.get("n_samples", 1) or 1))), 0.0
        return 0.0, float(restarts * (int(steps) if steps is not None else 1))

    # --- running --------------------------------------------------------------------------
    def __call__(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *,
                 bounds: Bounds = (0.0, 1.0), generator: Optional[torch.Generator] = None,
                 trace: bool = False) -> torch.Tensor:
        """``trace``: also keep every sample's loss per iteration (``self.telemetry.trace()``)."""
        self.stats = {}
        self.telemetry = Telemetry(len(x), x.device, trace) if _TELEMETRY_ON[0] else None
        if generator is None:
            generator = torch.Generator().manual_seed(0)  # on CPU: the same draws on every device
        x = x.detach()
        if self.keep_first_break:
            self.stats["first_break"] = x.clone()
            self.stats["first_break_seen"] = torch.zeros(len(x), dtype=torch.bool, device=x.device)
        if (self.eps == 0 and self.norm != "none") or not len(x):
            return x.clone()  # nothing to move (an empty batch: the library attacks index their first row)
        x_adv = self.perturb(model, x, y.detach(), bounds, generator)
        return x_adv.detach()

    def perturb(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bounds: Bounds,
                generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    # --- helpers for subclasses --------------------------------------------------------------
    def note_first_break(self, rows: torch.Tensor, points: torch.Tensor, logits: torch.Tensor,
                         y: torch.Tensor) -> None:
        """With ``keep_first_break``: ``stats["first_break"]`` takes, for each of ``rows`` seen broken at top-1 by
        ``logits`` for the first time, its point (``stats["first_break_seen"]`` says which rows have one). Why: a
        walk that stops a sample at top-5 (PGD's default) or not at all may carry it back across the top-1
        boundary; the ladder's rung 0 reads the user's row's walk and takes its verdict at this point too."""
        seen = self.stats.get("first_break_seen")
        if seen is None:
            return
        new = ~still_correct(logits.detach(), y, 1) & ~seen[rows]
        if bool(new.any()):
            at = rows[new]
            self.stats["first_break"][at] = points.detach()[new].to(self.stats["first_break"].dtype)
            seen[at] = True

    def input_grad(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                   loss_fn: str = "ce", rows: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(gradient of the summed loss w.r.t. x, logits). fp32 unless the runner enabled autocast.
        ``rows``: which samples of the attacked batch ``x`` holds (None: all), for the telemetry."""
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            logits = model(x)
            per = margin_losses(logits.float(), y) if loss_fn == "margin" else F.cross_entropy(logits.float(), y, reduction="none")
            (grad,) = torch.autograd.grad(per.sum(), x)
        if "grad_zero" not in self.stats:
            self.stats["grad_zero"] = grad.flatten(1).abs().amax(1).eq(0)  # on x's device: no host sync
        if self.telemetry is not None:
            self.telemetry.observe(rows, per, logits, y, grad)
        return grad.detach(), logits.detach()


def draw(kind: str, shape: Sequence[int], generator: torch.Generator, device: torch.device,
         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A random tensor drawn on the generator's device and moved to ``device``.

    Why: CPU and CUDA generators give different numbers for one seed, so drawing on the batch's
    device would make a GPU run's random starts (and so its records) differ from a CPU run's
    beyond rounding. With the runner's CPU generator the draws do not depend on ``device``.
    ``kind``: ``rand`` (uniform [0, 1)), ``randn`` (standard normal), ``sign`` (+-1 with
    probability 1/2 each), ``exponential`` (rate 1).
    """
    shape = tuple(int(s) for s in shape)
    if _ALIGNED and shape and shape[0] == len(_ALIGNED[1]):  # a re-run on some rows: draw as the full batch did
        n_full, rows = saved = list(_ALIGNED)
        _ALIGNED.clear()
        try:
            full = draw(kind, (n_full,) + shape[1:], generator, device, dtype)
        finally:
            _ALIGNED[:] = saved
        return full[rows.to(device)]
    src = generator.device
    if kind == "rand":
        t = torch.rand(shape, generator=generator, device=src, dtype=dtype)
    elif kind == "randn":
        t = torch.randn(shape, generator=generator, device=src, dtype=dtype)
    elif kind == "sign":  # drawn as int8 so the host->device copy is 1 byte per entry
        t = torch.randint(0, 2, shape, generator=generator, device=src, dtype=torch.int8)
        return (t.to(device).to(dtype) * 2 - 1)
    elif kind == "exponential":
        t = torch.empty(shape, device=src, dtype=dtype).exponential_(generator=generator)
    else:
        raise ValueError(f"unknown draw kind {kind!r}")
    return t.to(device)


_ALIGNED: list = []  # [n_full, rows] while :func:`aligned_draws` is active


@contextlib.contextmanager
def aligned_draws(n_full: int, rows: torch.Tensor) -> Iterator[None]:
    """Re-run an attack on ``rows`` of a batch of ``n_full`` with the draws those rows got in the full
    run: a draw whose first dimension is ``len(rows)`` is made for ``n_full`` rows, then indexed.
    Exact for draws shaped by the batch (random starts of PGD, PGD-L2, SLD, noise); draws of other
    shapes (SPSA's per-iteration directions, library attacks) still differ from the full run's."""
    _ALIGNED[:] = [n_full, rows]
    try:
        yield
    finally:
        _ALIGNED.clear()


def descend(attack: Attack, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, x_adv: torch.Tensor,
            steps: int, update: Any, early_stop: bool, stop_topk: int) -> torch.Tensor:
    """Iterated gradient steps, ``x_adv[i] <- update(x_adv[i], x[i], grad[i])``, on the samples
    still correct at top-``stop_topk`` when ``early_stop`` (a broken sample keeps its point); each iterate's
    top-1 break is noted (``Attack.note_first_break``)."""
    active = torch.arange(len(x), device=x.device)
    for _ in range(steps):
        if active.numel() == 0:
            break
        xa, xo, ya = x_adv[active], x[active], y[active]
        grad, logits = attack.input_grad(model, xa, ya, rows=active)
        attack.note_first_break(active, xa, logits, ya)
        if early_stop:
            alive = still_correct(logits, ya, stop_topk)
            active, xa, xo, grad = active[alive], xa[alive], xo[alive], grad[alive]
            if active.numel() == 0:
                break
        x_adv[active] = update(xa, xo, grad)
    return x_adv


def margin_losses(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample CW margin: max_{j != y} z_j - z_y (correct for negative logits too)."""
    z_y = logits.gather(1, y[:, None]).squeeze(1)
    other = logits.masked_fill(F.one_hot(y, logits.shape[1]).bool(), float("-inf")).amax(1)
    return other - z_y


def dlr_losses(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per sample -(z_y - max_{j != y} z_j) / (z_(1) - z_(3)): the DLR loss, invariant to shifting and
    scaling the logits (Croce & Hein 2020), higher = more adversarial (> 0 once misclassified)."""
    z = logits.float()
    top = z.sort(1, descending=True).values
    third = top[:, min(2, z.shape[1] - 1)]
    return margin_losses(z, y) / (top[:, 0] - third + 1e-12)


def margin_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Summed CW margin: max_{j != y} z_j - z_y (correct for negative logits too)."""
    return margin_losses(logits, y).sum()


def clip(x: torch.Tensor, bounds: Bounds) -> torch.Tensor:
    return x if bounds is None else x.clamp(bounds[0], bounds[1])


def project_linf(x_adv: torch.Tensor, x: torch.Tensor, eps: float, bounds: Bounds) -> torch.Tensor:
    return clip(torch.min(torch.max(x_adv, x - eps), x + eps), bounds)


LIBRARY_NORM = {"linf": "Linf", "l2": "L2"}  # pyautoattack's names of the threat models it implements


def project_ball(x_adv: torch.Tensor, x: torch.Tensor, eps: float, bounds: Bounds, norm: str) -> torch.Tensor:
    """``x_adv`` projected onto the ``norm`` ball of radius ``eps`` around ``x``, then into the box (clipping
    towards a box that holds ``x`` never moves a point further from it, so the result is in both)."""
    if norm == "linf":
        return project_linf(x_adv, x, eps, bounds)
    if norm != "l2":
        raise ValueError(f"project_ball: no projection for norm {norm!r}")
    delta = (x_adv - x).flatten(1)
    factor = (eps / delta.norm(dim=1).clamp_min(1e-12)).clamp(max=1.0)
    return clip(x + (delta * factor[:, None]).view_as(x), bounds)


def still_correct(logits: torch.Tensor, y: torch.Tensor, topk: int) -> torch.Tensor:
    """Per sample: is ``y`` among the top-``topk`` logits (the attack has not succeeded yet)."""
    k = min(topk, logits.shape[1])
    return (logits.topk(k, dim=1).indices == y[:, None]).any(1)


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


# iteration counts: 0 would silently turn the attack into the identity; settings that must be > 0
COUNTS = ("steps", "iterations", "n_samples", "n_queries", "search_steps", "restarts", "targets", "eot_iter")
POSITIVE = ("step_size", "step_size_factor", "lr", "fd_delta", "c_init")
_TYPE_WORDS = {"float": "a finite number (float)", "int": "a whole number (int)", "bool": "true or false (bool)",
               "str": "text (str)", "Optional[float]": "a finite number or none"}


def _finite_float(value: Any) -> float:
    """A float setting: a number or an "a/b" string; booleans and non-finite values are refused
    (the sign is checked by ``validate``, which can say what the setting needs)."""
    if isinstance(value, bool):
        raise ValueError
    v = number(value) if isinstance(value, str) else float(value)
    if not math.isfinite(v):
        raise ValueError
    return v


def _coerce(attack: str, key: str, value: Any, typ: Any, loc: str) -> Any:
    t = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    try:
        if t == "float":
            return _finite_float(value)
        if t == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if t == "bool":
            if isinstance(value, bool):
                return value
            if not isinstance(value, str):  # strict, as int settings refuse true: 1 or 0.0 is no boolean
                raise ValueError
            if str(value).lower() in ("true", "1", "yes"):
                return True
            if str(value).lower() in ("false", "0", "no"):
                return False
            raise ValueError
        if t == "str":
            return str(value)
        if t.startswith("Optional[float]"):
            return None if value in (None, "none", "None") else _finite_float(value)
    except (ValueError, TypeError, ZeroDivisionError, UserError):
        raise UserError(f"{loc}attack {attack!r}: setting {key!r} must be {_TYPE_WORDS.get(t, 'a ' + t)}, "
                        f"got {value!r}") from None
    return value
