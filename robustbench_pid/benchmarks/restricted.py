"""``restricted``: top-1/top-5 with the logits restricted to a dataset's 200 classes (ImageNet-A, -R).

Protocol (Hendrycks et al.): the 1000-class model's logits are indexed by the dataset's 200 class
indices (``robustbench_pid.core.imagenet_info.subset_indices``: timm's ``imagenet_{a,r}_indices.txt``),
the prediction is the argmax over those 200 (mapped back to its 1000-class index), top-5 likewise.
Labels are 1000-class indices (``sorted_wnids.index(folder)``). Images: the model's resize/crop
transform. Published reference (PIDformer Table 1, softmax DeiT-tiny): IN-A 6.90, IN-R 32.83 top-1.

Records: ``pred`` (1000-class index of the masked argmax), ``correct_top1/5``, ``skipped_unreadable``.
Tidy rows: ``top1``/``top5`` (percent, Wilson 95% intervals) and ``skipped_unreadable``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch

from ..runtime.health import check_finite
from ..specs import Unit, chunks
from . import Batch, Benchmark, Column, benchmarks


def masked_topk(logits: torch.Tensor, indices: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k over the masked classes, as 1000-class indices (B x k)."""
    sub = logits.index_select(1, indices)
    return indices[sub.topk(min(k, sub.shape[1]), dim=1).indices]


def dataset_mask(ctx: Any, benchmark: str) -> torch.Tensor:
    idx = getattr(ctx.dataset, "logit_indices", None)
    if not idx:
        from ..errors import UserError

        raise UserError(f"benchmark {benchmark!r} needs a dataset with a class mask (imagenet-a, imagenet-r, "
                        f"imagenet-o); {ctx.spec.dataset!r} has none")
    return torch.tensor(idx, dtype=torch.long, device=ctx.device)


def masked_records(ctx: Any, unit: Unit, b: Batch, idx: torch.Tensor) -> Tuple[Dict[str, Column], torch.Tensor]:
    """(records of the prediction restricted to the classes ``idx``, the logits)."""
    with torch.inference_mode():
        logits = ctx.verdict_model()(b.x).float()
    check_finite(logits, ctx, unit, "clean")
    top5 = masked_topk(logits, idx, 5)
    return {"sample_id": b.sample_ids, "label": b.y, "pred": top5[:, 0], "correct_top1": top5[:, 0] == b.y,
            "correct_top5": (top5 == b.y[:, None]).any(1),
            "skipped_unreadable": int(getattr(ctx.dataset, "n_unreadable", 0))}, logits


@benchmarks.register("restricted")
class Restricted(Benchmark):
    name = "restricted"
    samples = ("restricted",)

    def plan(self, ctx: Any) -> List[Unit]:
        dataset_mask(ctx, self.name)
        return [Unit(self.name, "clean", 0.0, '{"mask": "dataset 200 classes"}', "", a, b)
                for a, b in chunks(len(ctx.indices), ctx.spec.chunk_size)]

    def records(self, ctx: Any, unit: Unit, b: Batch) -> Dict[str, Column]:
        return masked_records(ctx, unit, b, dataset_mask(ctx, self.name))[0]

