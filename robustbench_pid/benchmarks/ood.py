"""``ood``: ImageNet-O out-of-distribution detection (dataset ``imagenet-o``).

Protocol (Hendrycks et al., "Natural Adversarial Examples"): in-distribution = the ImageNet val
images of the 200 ImageNet-O wnids (10,000), out-of-distribution = ImageNet-O (2,000); anomaly
score = -max softmax over the 200 masked logits (softmax taken over those 200 only); OOD is the
positive class; AUPR = scikit-learn ``average_precision_score`` x 100, plus AUROC and FPR at
95% TPR (``robustbench_pid.metrics.ood_detection_metrics``). Chance AUPR = the OOD fraction
(2000/12000 = 16.67 with the full sets), reported as the ``chance_aupr`` row. Published reference
(PIDformer Table 1, softmax DeiT-tiny): AUPR 17.47.

Records: ``score`` (anomaly score), ``ood`` (bool), ``pred`` / ``correct_top1/5`` (masked, meaningful on
the in-distribution rows), ``skipped_unreadable``; ``attack`` = ``in`` or ``ood``.
Tidy rows: ``aupr``, ``auroc``, ``fpr95``, ``chance_aupr`` and in-distribution ``top1``/``top5``.
"""
from __future__ import annotations

from typing import Any, List

import pandas as pd
import torch

from ..health import check_finite
from ..summaries.ood import ood_rows
from . import Benchmark, Unit, benchmarks
from .imagenet_c import condition_units
from .restricted import dataset_mask, masked_topk


@benchmarks.register("ood")
class OOD(Benchmark):
    name = "ood"

    def plan(self, ctx: Any) -> List[Unit]:
        dataset_mask(ctx, self.name)
        if not hasattr(ctx.dataset, "ood"):
            from ..errors import UserError

            raise UserError("benchmark 'ood' needs a dataset with in/out-of-distribution parts (imagenet-o)")
        return condition_units(ctx, self.name)

    def run_unit(self, ctx: Any, unit: Unit) -> pd.DataFrame:
        model = ctx.verdict_model()
        idx = dataset_mask(ctx, self.name)
        rows = []
        for x, y, sids in ctx.batches(unit):
            with torch.inference_mode():
                logits = model(x).float()
            check_finite(logits, ctx, unit, "clean")
            score = -torch.softmax(logits.index_select(1, idx), dim=1).amax(1)
            top5 = masked_topk(logits, idx, 5)
            rows.append(pd.DataFrame({
                "sample_id": sids, "label": y.cpu().numpy(), "pred": top5[:, 0].cpu().numpy(),
                "correct_top1": (top5[:, 0] == y).cpu().numpy(),
                "correct_top5": (top5 == y[:, None]).any(1).cpu().numpy(),
                "score": score.cpu().numpy(), "ood": unit.attack == "ood",
                "skipped_unreadable": int(getattr(ctx.dataset, "n_unreadable", 0))}))
            ctx.advance(len(y))
        return pd.concat(rows, ignore_index=True)

    def summarize(self, records: pd.DataFrame) -> pd.DataFrame:
        return ood_rows(records)
