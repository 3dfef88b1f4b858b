"""Numerical health checks: a run whose model says NaN must stop, not report argmax-of-NaN accuracy.

``check_finite`` is called on every forward pass of every benchmark (clean, attack, verdict). It
costs one ``torch.isfinite(t).all()`` reduced on the device and one host sync per batch; only
when that fails does it count the bad samples (the run stops there anyway). ``finite_kwargs``
refuses non-finite architecture arguments (PID gains, ``--model-arg``) before a model is built,
as ``parse_eps`` does for eps.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from ..results.conditions import eps_text_of
from ..errors import UserError


class NonFiniteError(UserError):
    """The model produced NaN or inf: nothing computed from it can be trusted, so the run stops."""


STAGES = {
    "clean": "clean pass (the unperturbed images)",
    "attack": "attack pass (the attack's perturbed inputs)",
    "verdict": "verdict pass (the model on the attacked images)",
}


def check_finite(t: torch.Tensor, ctx: Any, unit: Any, stage: str) -> None:
    """Stop the run with one line naming model, condition and count if ``t`` holds NaN/inf.

    ``t`` is a batch (first dimension = samples) of logits, or of inputs for the attack stage.
    """
    if bool(torch.isfinite(t).all()):
        return
    bad = ~torch.isfinite(t.detach().reshape(len(t), -1))
    n_bad = int(bad.any(1).sum())
    kinds = "/".join(k for k, m in (("NaN", torch.isnan(t).any()), ("inf", torch.isinf(t).any())) if bool(m))
    what = "inputs" if stage == "attack" else "logits"
    cond = unit.attack + (f" {unit.condition}" if unit.condition and unit.condition != unit.attack else "")
    if unit.eps:
        cond += f" eps={eps_text_of(unit.attack, unit.eps)}"
    raise NonFiniteError(
        f"model {ctx.spec.model!r} gave non-finite {what} ({kinds}) for {n_bad} of {len(t)} samples in the "
        f"{STAGES.get(stage, stage)} of {unit.benchmark}/{cond}, samples [{unit.start}:{unit.stop}]; its results "
        f"would be meaningless, so the run stopped (the folder stays 'running'). Check the checkpoint for NaN/inf "
        f"weights, the --lambda-*/--model-arg values, and try --precision fp32")


def _non_finite(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, (int, float)):
        return not math.isfinite(v)
    if isinstance(v, str):
        try:
            return not math.isfinite(float(v))
        except ValueError:
            return False
    if isinstance(v, Mapping):
        return any(_non_finite(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return any(_non_finite(x) for x in v)
    return False


def finite_kwargs(kwargs: Mapping[str, Any], model: str) -> None:
    """Refuse NaN/inf architecture arguments (``--lambda-p nan``, ``--model-arg beta=inf``) up front."""
    bad = {k: v for k, v in kwargs.items() if _non_finite(v)}
    if bad:
        flags = ", ".join(f"{k}={v}" for k, v in bad.items())
        opts = ", ".join(f"--{k.replace('_', '-')}" if k in GAIN_FLAGS else f"--model-arg {k}=VALUE" for k in bad)
        raise UserError(f"model {model!r}: architecture argument(s) {flags} must be finite numbers (NaN/inf make "
                        f"every output NaN); give {opts} a finite value")


GAIN_FLAGS = ("lambda_p", "lambda_i", "lambda_d", "beta")  # the evaluate options of the PID gains
