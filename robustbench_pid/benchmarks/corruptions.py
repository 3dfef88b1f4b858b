"""``corruptions``: the 15 ImageNet-C corruptions x severities 1..5, applied on the fly to any dataset.

Protocol: the clean images plus, for every corruption and severity, each image corrupted by
``robustbench_pid.data.generators.corruptions`` with its own seed (from ``--seed``, corruption, severity and
sample id: reproducible, independent of batching); top-1/top-5 of the plain prediction.
The Python option ``benchmark_options={"corruptions": {"corruptions": [...], "severities": [...]}}``
picks other corruptions (e.g. the 4 held-out ones) or severities. With ``--workers N`` the images
are corrupted inside the DataLoader workers (the CPU-bound part), with the same records.

Records: ``attack`` = ``condition`` = ``<corruption>/<severity>`` (or ``clean``), ``eps`` = 0
(a corruption has no eps), plus ``corruption`` and ``severity`` columns.

Tidy rows (``robustbench_pid.results.summaries.corruptions``, values in percent): ``top1``/``top5`` per
condition; ``err_<corruption>`` and ``mean_err`` always; ``ce_<corruption>``, ``mce``, ``relative_mce``
when a baseline exists: AlexNet for ImageNet, otherwise the model named by the explicit ``ce_baseline``
option of the result readers.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Tuple

import torch
from torch.utils.data import DataLoader, Dataset

from ..core.imagenet_info import CORRUPTIONS_15, SEVERITIES
from ..attacks.base import still_correct
from ..errors import without_worker_traceback
from ..runtime.health import check_finite
from ..specs import Unit, chunks
from . import Batch, Benchmark, Column, benchmarks

# AlexNet's published errors are for ImageNet validation images (ImageNet-C): only these datasets use them.
IMPL_VERSION = "rbp-corruptions-1"


def _options(ctx: Any) -> Dict[str, Any]:
    return dict(ctx.spec.benchmark_options.get("corruptions", {}))


def predict_records(ctx: Any, unit: Unit, b: Batch) -> Dict[str, Column]:
    """Plain prediction records of a batch (the logits checked for NaN/inf first)."""
    with torch.inference_mode():
        logits = ctx.verdict_model()(b.x).float()
    check_finite(logits, ctx, unit, "clean")
    return {"sample_id": b.sample_ids, "label": b.y, "pred": logits.argmax(1),
            "correct_top1": still_correct(logits, b.y, 1), "correct_top5": still_correct(logits, b.y, 5)}


@benchmarks.register("corruptions")
class Corruptions(Benchmark):
    name = "corruptions"
    options = {"corruptions": "list of corruption names, default the 15 ImageNet-C ones",
               "severities": "list of severities 1..5, default all"}
    option_kinds = {"corruptions": "names", "severities": "counts"}

    def plan(self, ctx: Any) -> List[Unit]:
        from ..data.generators.corruptions import check_corruption, corrupt_tta_version

        opts = _options(ctx)
        names = list(opts.get("corruptions") or CORRUPTIONS_15)
        sevs = [int(s) for s in opts.get("severities") or SEVERITIES]
        for c in names:
            for s in sevs:
                check_corruption(c, s)
        spans = chunks(len(ctx.indices), ctx.spec.chunk_size)
        units = [Unit(self.name, "clean", 0.0, "{}", "clean", a, b) for a, b in spans]
        for c in names:
            for s in sevs:
                params = json.dumps({"corruption": c, "severity": s, "impl": IMPL_VERSION,
                                     "corrupt_tta": corrupt_tta_version()}, sort_keys=True)
                units += [Unit(self.name, f"{c}/{s}", 0.0, params, f"{c}/{s}", a, b) for a, b in spans]
        return units

    def batches(self, ctx: Any, unit: Unit) -> Iterator[Batch]:
        """The unit's images, corrupted: in the DataLoader workers with --workers, else here."""
        from ..data.generators.corruptions import corrupt_batch, sample_seed

        name, sev = split_condition(unit.condition)
        if not name:
            yield from ctx.batches(unit)
        elif int(getattr(ctx.spec, "num_workers", 0) or 0) > 0:
            yield from without_worker_traceback(_corrupted_batches(ctx, unit, name, sev))
        else:
            for b in ctx.batches(unit):
                seeds = [sample_seed(ctx.spec.seed, name, sev, s) for s in b.sample_ids]
                yield Batch(corrupt_batch(b.x, name, sev, seeds), b.y, b.sample_ids)

    def records(self, ctx: Any, unit: Unit, b: Batch) -> Dict[str, Column]:
        name, sev = split_condition(unit.condition)
        return {**predict_records(ctx, unit, b), "corruption": name, "severity": sev}


# --------------------------------------------------------------------------- corruption in workers

class _CorruptedView(Dataset):
    """Items keyed ``(index, corruption, severity)``: loading and corrupting happen in the
    DataLoader workers (``--workers N``), the CPU-bound part of this benchmark. Same per-sample
    seeds as the in-process path, so the records are identical."""

    def __init__(self, base: Any, seed: int) -> None:
        self.base, self.seed = base, seed

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key: Tuple[int, str, int]) -> Tuple[torch.Tensor, int]:
        from ..data.generators.corruptions import corrupt_batch, sample_seed

        i, name, sev = key
        x, y = self.base[i]
        s = sample_seed(self.seed, name, sev, self.base.sample_ids[i])
        return corrupt_batch(x[None].float(), name, sev, [s])[0], y


class _Plan:
    """A batch sampler whose batches are set before each unit (persistent workers survive units)."""

    def __init__(self) -> None:
        self.batches: List[List[Tuple[int, str, int]]] = []

    def __iter__(self):
        return iter(list(self.batches))

    def __len__(self) -> int:
        return len(self.batches)


def _corrupted_batches(ctx: Any, unit: Unit, name: str, sev: int) -> Iterator[Batch]:
    state = getattr(ctx, "_corruption_loader", None)
    if state is None:
        plan = _Plan()
        w = int(ctx.spec.num_workers)
        loader = DataLoader(_CorruptedView(ctx.dataset, ctx.spec.seed), batch_sampler=plan, num_workers=w,
                            persistent_workers=True, prefetch_factor=4, pin_memory=ctx.device.type == "cuda")
        state = (plan, loader)
        setattr(ctx, "_corruption_loader", state)
    plan, loader = state
    idx = ctx.indices[unit.start:unit.stop]
    bs = int(getattr(ctx, "batch_size", 0) or ctx.spec.batch_size)
    plan.batches = [[(i, name, sev) for i in idx[k:k + bs]] for k in range(0, len(idx), bs)]
    pos = 0
    for x, y in loader:
        n = len(y)
        sids = [ctx.dataset.sample_ids[i] for i in idx[pos:pos + n]]
        pos += n
        yield Batch(x.to(ctx.device, non_blocking=True).float(), y.to(ctx.device, non_blocking=True).long(), sids)
    if pos != len(idx):
        raise RuntimeError(f"corruption loader returned {pos} of {len(idx)} samples")


# --------------------------------------------------------------------------- summaries

def split_condition(condition: str) -> Tuple[str, int]:
    """'gaussian_noise/3' -> ('gaussian_noise', 3); 'clean' -> ('', 0)."""
    if not condition or condition == "clean":
        return "", 0
    name, sev = condition.rsplit("/", 1)
    return name, int(sev)


