"""``robustbench_corruptions``: RobustBench's corruptions leaderboard on its own data (``--suite
robustbench-corruptions``): the released CIFAR-10-C / CIFAR-100-C arrays (``data/cifar_c.py``) or RobustBench's
5,000-image ImageNet-C subset, plus the clean images, each cell scored as RobustBench's ``clean_accuracy`` does (top-1
of the plain prediction, no other transform).

Records are the ``imagenet_c`` benchmark's (``condition`` = ``<corruption>/<severity>`` or ``clean``, ``corruption``,
``severity``) plus where each image came from, when the dataset says: ``row`` (its row in the released file),
``file``, ``file_size`` and ``file_mtime_ns``. Tidy rows (``results/summaries/corruptions.py``): the corruption rows
plus ``corruptions_acc``, RobustBench's mean over the 75 cells (mCE against AlexNet's published errors for ImageNet).
"""
from __future__ import annotations

from typing import Any, Dict

from ..specs import Unit
from . import Batch, Column, benchmarks
from .imagenet_c import ImageNetC


@benchmarks.register("robustbench_corruptions")
class RobustBenchCorruptions(ImageNetC):
    name = "robustbench_corruptions"
    samples = ("corrupted",)

    def records(self, ctx: Any, unit: Unit, b: Batch) -> Dict[str, Column]:
        out = super().records(ctx, unit, b)
        where = getattr(ctx.dataset, "record_columns", None)
        if where is not None:
            out.update(where(b.sample_ids))
        return out
