"""``imagenet_c``: a model on the user's ImageNet-C files (dataset ``imagenet-c``), scored as published.

Protocol: every file of ``<root>/[<category>/]<corruption>/<severity>/<wnid>/*.JPEG`` is read as is
(224x224; ToTensor only, normalization inside the model; no resize), top-1 of the plain
prediction. Per corruption c: CE_c = 100 x sum_s E_{s,c} / sum_s E^AlexNet_{s,c}; mCE = mean CE
over the 15 corruptions (hendrycks/robustness constants); relative mCE needs the clean error, which
is measured on the same (wnid, file) ImageNet val images when the ImageNet root is given
(the dataset option ``imagenet_root``, whose default is ``$ROBUSTBENCH_PID_IMAGENET_ROOT``), with the model's
usual resize/crop transform. The 4 held-out corruptions, when present, get ``err_<c>`` rows only.

Records and tidy rows are those of the ``corruptions`` benchmark (``condition`` = ``c/s``;
metrics ``top1``, ``top5``, ``err_<c>``, ``mean_err``, ``ce_<c>``, ``mce``, ``relative_mce``),
plus ``skipped_unreadable`` (images dropped by ``--skip-unreadable``) on every record.
Use ``--subset N`` (the same N images in every condition), not ``--limit`` (which would take the
first N files, i.e. only the first condition).
"""
from __future__ import annotations

import json
from typing import Any, Dict, List


from ..specs import Unit
from . import Batch, Benchmark, Column, benchmarks
from .corruptions import predict_records, split_condition


def condition_units(ctx: Any, benchmark: str) -> List[Unit]:
    """Units over contiguous runs of equal ``dataset.conditions`` (chunked by --chunk-size)."""
    conds = getattr(ctx.dataset, "conditions", None)
    if conds is None:
        from ..errors import UserError

        raise UserError(f"benchmark {benchmark!r} needs a dataset with per-sample conditions (e.g. imagenet-c)")
    units: List[Unit] = []
    i, n = 0, len(ctx.indices)
    while i < n:
        c = conds[ctx.indices[i]]
        j = i
        while j < n and conds[ctx.indices[j]] == c:
            j += 1
        if c in ("clean", "in", "ood", ""):
            params = "{}"
        else:
            name, sev = c.rsplit("/", 1)
            params = json.dumps({"corruption": name, "severity": int(sev)}, sort_keys=True)
        for s in range(i, j, ctx.spec.chunk_size):
            units.append(Unit(benchmark, c or "clean", 0.0, params, c, s, min(j, s + ctx.spec.chunk_size)))
        i = j
    return units


@benchmarks.register("imagenet_c")
class ImageNetC(Benchmark):
    name = "imagenet_c"
    samples = ("corrupted",)

    def plan(self, ctx: Any) -> List[Unit]:
        return condition_units(ctx, self.name)

    def records(self, ctx: Any, unit: Unit, b: Batch) -> Dict[str, Column]:
        name, sev = split_condition(unit.condition)
        return {**predict_records(ctx, unit, b), "corruption": name, "severity": sev,
                "skipped_unreadable": int(getattr(ctx.dataset, "n_unreadable", 0))}


