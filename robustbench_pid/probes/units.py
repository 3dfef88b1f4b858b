"""``--analyze attention`` inside a run: one hooked forward pass per batch on the attack's final points.

``probe_batches`` wraps a unit's batches (``benchmarks/adversarial.py``) and passes them on unchanged;
for each it runs the model (eager, fp32, no grad) with the probe's hooks on the clean images (the clean
unit) or on ``x_adv`` (an attack unit; x itself where the sample was not attacked), and leaves the
unit's rows in ``ctx.sidecars[unit.key]["attention"]`` for the runner to write beside the records.

The shift needs the clean representations: the clean unit of a chunk keeps them (per batch, on the
device) for the chunk's attack units, which the runner computes next (chunk-major); a unit that finds
none (another shard computed the clean unit) recomputes them, one more forward pass.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, Iterator, Tuple

import pandas as pd
import torch

from .rank_collapse import token_representations
from ..results.report.indicators import UNCONSTRAINED
from ..specs import Unit
from .attention import layer_metrics, rows

NAME = "attention"


def enabled(ctx: Any) -> bool:
    return NAME in (getattr(getattr(ctx, "spec", None), "analyze", None) or ())


def _clean_cache(ctx: Any, unit: Unit) -> Dict[Tuple[str, int], Dict[int, torch.Tensor]]:
    """The chunk's clean representations by batch; a new chunk drops the previous one's."""
    span = (unit.start, unit.stop)
    held = getattr(ctx, "_probe_clean", None)
    if held is None or held[0] != span:
        held = (span, {})
        ctx._probe_clean = held
    return held[1]


def probe_batches(ctx: Any, unit: Unit, batches: Iterable[Any]) -> Iterator[Any]:
    if not enabled(ctx):
        yield from batches
        return
    if unit.condition == UNCONSTRAINED:  # --indicators' unbounded check run: evidence on the attack, not a condition
        yield from batches
        empty = pd.DataFrame({"sample_id": pd.Series(dtype=str), "layer": pd.Series(dtype="int64"),
                              "metric": pd.Series(dtype=str), "value": pd.Series(dtype="float64"),
                              "moved": pd.Series(dtype=bool), "note": pd.Series(dtype=str)})
        ctx.sidecars.setdefault(unit.key, {})[NAME] = empty  # every unit of the plan has its file (merge_sidecars)
        return
    model, frames = ctx.model, []  # the eager model: the hooks live on its modules
    cache = _clean_cache(ctx, unit)
    for b in batches:
        key = (str(b.sample_ids[0]), len(b.sample_ids))
        if b.attack is None:
            reps, values, absent = layer_metrics(model, b.x)
            cache[key] = reps
            moved = torch.zeros(len(b.sample_ids), dtype=torch.bool)
        else:
            clean = cache.get(key)
            if clean is None:
                clean = token_representations(model, b.x)[1]
            _, values, absent = layer_metrics(model, b.x_adv, clean)
            moved = (b.x_adv != b.x).flatten(1).any(1) & b.attacked.to(b.x.device)
        frames.append(rows(list(map(str, b.sample_ids)), values, absent, moved.cpu().numpy()))
        yield b
    if frames:
        ctx.sidecars.setdefault(unit.key, {})[NAME] = pd.concat(frames, ignore_index=True)


def check_model(ctx: Any) -> None:
    """--analyze attention needs transformer blocks (``model.blocks`` or ``model.net.blocks``)."""
    from ..errors import UserError

    net = getattr(ctx.model, "net", ctx.model)
    blocks = getattr(net, "blocks", None)
    if not isinstance(blocks, (torch.nn.ModuleList, torch.nn.Sequential)) or len(blocks) == 0:
        raise UserError(f"--analyze attention reads the transformer blocks of a ViT-like model (`model.blocks`); "
                        f"{type(net).__name__} has none: drop --analyze attention for this model")


def extra_passes(ctx: Any, unit: Unit) -> float:
    """Forward passes per sample the analysis adds to a unit (the dry run's estimate): one, on the
    final points (plus one where an attack unit must recompute the clean representations)."""
    return 1.0 if enabled(ctx) and unit.benchmark == "adversarial" else 0.0
