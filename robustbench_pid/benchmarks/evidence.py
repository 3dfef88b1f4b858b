"""The torch side of the evidence that each attack worked (the decisions are ``results/report/indicators.py``).

Per batch of an attack unit, after the attack ran on the selected samples ``sel``:
- telemetry columns (``attacks/telemetry.py``) scattered to the whole batch, plus the loss and the
  margin (true-class logit minus the best other) at the returned point, from the verdict logits
  (no extra pass);
- always (it costs no pass: the trace is the losses the attack computed anyway, kept in memory): the
  loss trend over the trace (incomplete optimisation), so the default output shows it;
- with ``--indicators``: the loss
  variation at the input under repeats and tiny noise (unstable predictions: 9 extra forward
  passes per attacked sample, not charged to the attack's passes), from a generator of their own
  so the attack's draws, and so its records, are the same with or without ``--indicators``;
- with ``--trace``: every sample's loss per iterate (then the returned point) as a list column,
  which ``results/files/trace.py`` moves out of the records into ``trace.parquet``;
- with ``--agreement N`` (only with bf16/fp16 or --compile): the chosen samples re-attacked in fp32
  eager from the same generator state with aligned draws, and whether their top-1 verdict agrees.
Also the unconstrained conditions ``--indicators`` adds to the plan (:func:`unconstrained_units`).
"""
from __future__ import annotations

import json
import zlib
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from ..attacks import make_attack
from ..attacks.base import aligned_draws, still_correct
from ..attacks.telemetry import ENABLED as TELEMETRY_ON
from ..attacks.telemetry import Telemetry, attack_loss, neg_margin
from ..runtime.device import attack_precision
from ..results.report.indicators import (LIBRARY_ATTACKS, UNCONSTRAINED, UNCONSTRAINED_EPS, UNSTABLE_DRAWS, UNSTABLE_RADIUS, loss_trend, loss_variation)
from ..specs import Unit, chunks


def unconstrained_units(ctx: Any, settings: List[dict], names: List[str]) -> List[Unit]:
    """One unconstrained condition per worst-case attack family of the plan: the same settings at
    eps = ``UNCONSTRAINED_EPS[norm]`` without random start (so it starts from the input)."""
    units: List[Unit] = []
    seen = set()
    for name, params in zip(names, settings):
        attack = make_attack(name, **params)
        if not attack.worst_case or attack.norm not in UNCONSTRAINED_EPS:
            continue
        kw: Dict[str, Any] = {"eps": UNCONSTRAINED_EPS[attack.norm]}
        if "random_start" in attack.param_names():
            kw["random_start"] = False
        p = type(attack).from_params({**params, **kw}).params()
        js = json.dumps(p, sort_keys=True)
        if js in seen:
            continue
        seen.add(js)
        for s, e in chunks(len(ctx.indices), ctx.spec.chunk_size):
            units.append(Unit("adversarial", name, float(p["eps"]), js, UNCONSTRAINED, s, e))
    return units


def wants_trace(ctx: Any) -> bool:
    """Keep each sample's loss per iterate in memory: always (the incomplete-optimisation indicator reads
    it, at no extra pass); written out only with ``--trace``."""
    return True


def generator_state(ctx: Any) -> bool:
    """Whether the batch's generator state must be kept for an fp32 re-run."""
    return bool(ctx.spec.agreement) and ctx.spec.protocol != "paper"


def _scatter(n: int, sel: torch.Tensor, v: torch.Tensor, fill: Any) -> torch.Tensor:
    out = torch.full((n,), fill, dtype=v.dtype, device=v.device)
    out[sel] = v
    return out


def batch_evidence(ctx: Any, unit: Unit, b: Any, sel: torch.Tensor, gen_state: Optional[torch.Tensor]) -> Dict[str, Any]:
    """The evidence columns of one attacked batch ``b`` (``AttackedBatch`` with verdict logits)."""
    attack, y, n = b.attack, b.y, len(b.y)
    if not TELEMETRY_ON[0]:  # switched off by the overhead benchmark only
        return {}
    tel = attack.telemetry if len(sel) else Telemetry(0, y.device, wants_trace(ctx))  # nothing attacked
    nan = float("nan")
    if tel is None or tel.n != len(sel):
        raise RuntimeError(f"attack {attack.name!r} left no telemetry for its {len(sel)} samples")
    cols: Dict[str, Any] = {}
    t = tel.columns()
    library = attack.name in LIBRARY_ATTACKS
    ys, logits = y[sel], b.adv_logits[sel]
    target = b.clean_pred[sel] if b.paper else ys  # the labels the attack was given (paper: its own predictions)
    end = attack_loss(attack.loss_kind, logits, target)
    cols["passes_forward"] = _scatter(n, sel, t["passes_forward"] + 1, 0.0)  # + the verdict pass
    cols["passes_backward"] = _scatter(n, sel, t["passes_backward"], 0.0)
    cols["iterations"] = _scatter(n, sel, torch.full_like(end, nan) if library else t["iterations"], nan)
    cols["loss_start"] = _scatter(n, sel, t["loss_start"], nan)
    cols["loss_best"] = _scatter(n, sel, torch.fmax(t["loss_best"], end), nan)
    cols["loss_end"] = _scatter(n, sel, end, nan)
    cols["margin"] = _scatter(n, sel, -neg_margin(logits, ys), nan)
    ever = t["ever_adversarial"].float() if not library else torch.full_like(end, nan)
    cols["ever_adversarial"] = _scatter(n, sel, torch.fmax(ever, (logits.argmax(1) != target).float())
                                        if not library else ever, nan)
    zero = t["grad_zero_steps"] if attack.uses_gradients and not library else torch.full_like(end, nan)
    cols["grad_zero_steps"] = _scatter(n, sel, zero, nan)
    if wants_trace(ctx):
        trace = torch.cat([tel.trace(), end[:, None]], 1).cpu().numpy()
        if not library:  # incomplete optimisation: by default, it costs no pass
            steps = tel.trace().shape[1]
            trend = loss_trend(trace) if steps >= 2 else np.full(len(trace), np.nan)
            cols["loss_trend"] = _scatter(n, sel, torch.as_tensor(trend, dtype=torch.float32, device=y.device), nan)
        if ctx.spec.trace:
            lists: List[Any] = [None] * n
            for i, j in enumerate(sel.tolist()):
                row = trace[i]
                lists[j] = row[np.isfinite(row)].astype(np.float32)
            cols["loss_trace"] = lists
    if ctx.spec.indicators and not b.paper:
        v = _variation(ctx, attack, b.x[sel], ys, b.sample_ids) if len(sel) else end
        cols["loss_variation"] = _scatter(n, sel, v, nan)
    if gen_state is not None:
        cols["agreement"] = _agreement(ctx, b, sel, gen_state)
    return cols


def _variation(ctx: Any, attack: Any, x: torch.Tensor, y: torch.Tensor, sids: List[str]) -> torch.Tensor:
    """Relative loss change at ``x`` under one repeat and ``UNSTABLE_DRAWS`` uniform noises of radius
    ``UNSTABLE_RADIUS``, through the attacked model at the attack's precision."""
    g = torch.Generator().manual_seed(zlib.crc32(("unstable:" + str(sids[0])).encode()))
    model = ctx.attacked_model()
    with torch.no_grad(), attack_precision(ctx.device, ctx.spec.precision):
        base = attack_loss(attack.loss_kind, model(x), y)
        around = [attack_loss(attack.loss_kind, model(x), y)]
        for _ in range(UNSTABLE_DRAWS):
            u = torch.rand(x.shape, generator=g).to(x.device, x.dtype)
            around.append(attack_loss(attack.loss_kind, model((x + (2 * u - 1) * UNSTABLE_RADIUS).clamp(0, 1)), y))
    v = loss_variation(base.cpu().numpy(), torch.stack(around, 1).cpu().numpy())
    return torch.as_tensor(v, dtype=torch.float32, device=y.device)


def chosen_ids(ctx: Any) -> set:
    """The seeded subsample of ``--agreement N`` positions of the evaluated set, as sample ids."""
    cache = ctx.__dict__.setdefault("_agreement_ids", {})
    if "ids" not in cache:
        rng = np.random.default_rng(ctx.spec.seed)
        pos = rng.permutation(len(ctx.indices))[:ctx.spec.agreement]
        cache["ids"] = {str(ctx.dataset.sample_ids[ctx.indices[int(p)]]) for p in pos}
    return cache["ids"]


def _agreement(ctx: Any, b: Any, sel: torch.Tensor, gen_state: torch.Tensor) -> torch.Tensor:
    """1.0 / 0.0: the fp32 eager top-1 verdict agrees / disagrees with the run's; NaN: not checked."""
    n = len(b.y)
    out = torch.full((n,), float("nan"), device=b.y.device)
    ids = chosen_ids(ctx)
    rows = [i for i, j in enumerate(sel.tolist()) if str(b.sample_ids[j]) in ids]
    if not rows:
        return out
    r = torch.tensor(rows, dtype=torch.long)
    idx = sel[r.to(sel.device)]
    g = torch.Generator().manual_seed(0)
    g.set_state(gen_state)
    attack = make_attack(b.attack.name, **b.attack.params())
    with aligned_draws(n, idx.cpu()):  # the attack's draws were made for the whole batch (adversarial.py)
        x32 = attack(ctx.model, b.x[idx], b.y[idx], bounds=(0.0, 1.0), generator=g)
    with torch.inference_mode():
        logits32 = ctx.model(x32).float()
    ys = b.y[idx]
    ok32 = still_correct(logits32, ys, 1) & b.clean_correct_top1[idx]
    ok = still_correct(b.adv_logits[idx], ys, 1) & b.clean_correct_top1[idx]
    out[idx] = (ok32 == ok).float()
    return out
