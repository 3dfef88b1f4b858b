"""``corruptions``: the 15 ImageNet-C corruptions x severities 1..5, applied on the fly to any dataset.

Protocol: the clean images plus, for every corruption and severity, each image corrupted by
``robustbench_pid.corruptions`` with its own seed (from ``--seed``, corruption, severity and
sample id: reproducible, independent of batching); top-1/top-5 of the plain prediction.
The Python option ``benchmark_options={"corruptions": {"corruptions": [...], "severities": [...]}}``
picks other corruptions (e.g. the 4 held-out ones) or severities. With ``--workers N`` the images
are corrupted inside the DataLoader workers (the CPU-bound part), with the same records.

Records: ``attack`` = ``condition`` = ``<corruption>/<severity>`` (or ``clean``), ``eps`` = 0
(a corruption has no eps), plus ``corruption`` and ``severity`` columns.

Tidy rows: ``robustbench_pid.summaries.corruptions`` (err/mean_err always; CE, mCE and relative
mCE normalized by AlexNet on ImageNet, otherwise by the model the ``ce_baseline`` argument names).
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset

from ..imagenet_info import CORRUPTIONS_15, SEVERITIES
from ..summaries.corruptions import corruptions_summary
from ..errors import without_worker_traceback
from ..health import check_finite
from . import Benchmark, Unit, benchmarks

IMPL_VERSION = "rbp-corruptions-1"


def topk_correct(logits: torch.Tensor, y: torch.Tensor, k: int) -> torch.Tensor:
    k = min(k, logits.shape[1])
    return (logits.topk(k, dim=1).indices == y[:, None]).any(1)


def _options(ctx: Any) -> Dict[str, Any]:
    return dict(ctx.spec.benchmark_options.get("corruptions", {}))


def predict_records(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, sids: List[str],
                    ctx: Any = None, unit: Optional[Unit] = None) -> Dict[str, Any]:
    """Plain prediction records; with ``ctx``/``unit`` the logits are checked for NaN/inf first."""
    with torch.inference_mode():
        logits = model(x).float()
    if ctx is not None:
        check_finite(logits, ctx, unit, "clean")
    return {"sample_id": sids, "label": y.cpu().numpy(), "pred": logits.argmax(1).cpu().numpy(),
            "correct_top1": topk_correct(logits, y, 1).cpu().numpy(),
            "correct_top5": topk_correct(logits, y, 5).cpu().numpy()}


@benchmarks.register("corruptions")
class Corruptions(Benchmark):
    name = "corruptions"
    options = {"corruptions": "list of corruption names, default the 15 ImageNet-C ones",
               "severities": "list of severities 1..5, default all"}

    def plan(self, ctx: Any) -> List[Unit]:
        from ..corruptions import check_corruption, corrupt_tta_version
        from ..runner import chunks

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

    def run_unit(self, ctx: Any, unit: Unit) -> pd.DataFrame:
        from ..corruptions import corrupt_batch, sample_seed

        model = ctx.verdict_model()
        name, sev = split_condition(unit.condition)
        rows = []
        workers = name and int(getattr(ctx.spec, "num_workers", 0) or 0) > 0
        batches = _corrupted_batches(ctx, unit, name, sev) if workers else ctx.batches(unit)
        for x, y, sids in without_worker_traceback(batches):
            if name and not workers:
                seeds = [sample_seed(ctx.spec.seed, name, sev, s) for s in sids]
                x = corrupt_batch(x, name, sev, seeds)
            rec = predict_records(model, x, y, sids, ctx, unit)
            rec.update(corruption=name, severity=sev)
            rows.append(pd.DataFrame(rec))
            ctx.advance(len(y))
        return pd.concat(rows, ignore_index=True)

    def summarize(self, records: pd.DataFrame, ce_baseline: Optional[str] = None) -> pd.DataFrame:
        return corruptions_summary(records, ce_baseline=ce_baseline)


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
        from ..corruptions import corrupt_batch, sample_seed

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


def _corrupted_batches(ctx: Any, unit: Unit, name: str, sev: int):
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
        yield x.to(ctx.device, non_blocking=True).float(), y.to(ctx.device, non_blocking=True).long(), sids
    if pos != len(idx):
        raise RuntimeError(f"corruption loader returned {pos} of {len(idx)} samples")


# --------------------------------------------------------------------------- summaries

def split_condition(condition: str) -> Tuple[str, int]:
    """'gaussian_noise/3' -> ('gaussian_noise', 3); 'clean' -> ('', 0)."""
    if not condition or condition == "clean":
        return "", 0
    name, sev = condition.rsplit("/", 1)
    return name, int(sev)
