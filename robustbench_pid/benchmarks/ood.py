"""``ood``: ImageNet-O out-of-distribution detection (dataset ``imagenet-o``).

Protocol (Hendrycks et al., "Natural Adversarial Examples"): in-distribution = the ImageNet val
images of the 200 ImageNet-O wnids (10,000), out-of-distribution = ImageNet-O (2,000); anomaly
score = -max softmax over the 200 masked logits (softmax taken over those 200 only); OOD is the
positive class; AUPR = scikit-learn ``average_precision_score`` x 100, plus AUROC and FPR at
95% TPR (``robustbench_pid.results.stats.metrics.ood_detection_metrics``). Chance AUPR = the OOD fraction
(2000/12000 = 16.67 with the full sets), reported as the ``chance_aupr`` row. Published reference
(PIDformer Table 1, softmax DeiT-tiny): AUPR 17.47.

Records: ``score`` (anomaly score), ``ood`` (bool), ``pred`` / ``correct_top1/5`` (masked, meaningful on
the in-distribution rows), ``skipped_unreadable``; ``attack`` = ``in`` or ``ood``.
Tidy rows: ``aupr``, ``auroc``, ``fpr95``, ``chance_aupr`` and in-distribution ``top1``/``top5``.
"""
from __future__ import annotations

from typing import Any, Dict, List

import torch

from ..specs import Unit
from . import Batch, Benchmark, Column, benchmarks
from .imagenet_c import condition_units
from .restricted import dataset_mask, masked_records


@benchmarks.register("ood")
class OOD(Benchmark):
    name = "ood"
    samples = ("ood",)

    def plan(self, ctx: Any) -> List[Unit]:
        dataset_mask(ctx, self.name)
        if not hasattr(ctx.dataset, "ood"):
            from ..errors import UserError

            raise UserError("benchmark 'ood' needs a dataset with in/out-of-distribution parts (imagenet-o)")
        return condition_units(ctx, self.name)

    def records(self, ctx: Any, unit: Unit, b: Batch) -> Dict[str, Column]:
        idx = dataset_mask(ctx, self.name)
        rec, logits = masked_records(ctx, unit, b, idx)
        score = -torch.softmax(logits.index_select(1, idx), dim=1).amax(1)
        rec = dict(rec)
        skipped = rec.pop("skipped_unreadable")
        return {**rec, "score": score, "ood": unit.attack == "ood", "skipped_unreadable": skipped}

