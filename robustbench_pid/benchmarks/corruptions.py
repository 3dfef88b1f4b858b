"""``corruptions``: the 15 ImageNet-C corruptions x severities 1..5, applied on the fly to any dataset.

Protocol: the clean images plus, for every corruption and severity, each image corrupted by
``robustbench_pid.corruptions`` with its own seed (from ``--seed``, corruption, severity and
sample id: reproducible, independent of batching); top-1/top-5 of the plain prediction.
The Python option ``benchmark_options={"corruptions": {"corruptions": [...], "severities": [...]}}``
picks other corruptions (e.g. the 4 held-out ones) or severities. With ``--workers N`` the images
are corrupted inside the DataLoader workers (the CPU-bound part), with the same records.

Records: ``attack`` = ``condition`` = ``<corruption>/<severity>`` (or ``clean``), ``eps`` = 0
(a corruption has no eps), plus ``corruption`` and ``severity`` columns.

Tidy rows (values in percent): ``top1``/``top5`` per condition; ``err_<corruption>`` (top-1 error
averaged over the severities) and ``mean_err`` (over the 15 mCE corruptions), always;
``ce_<corruption>``, ``mce``, ``relative_mce`` when a baseline exists: AlexNet for ``imagenet`` and ``imagenet-c``
(ImageNet validation images), otherwise the model named by ``ROBUSTBENCH_PID_CE_BASELINE`` (or the ``baseline``
argument of ``corruption_rows``) whose records for the same dataset, split and samples are in the
same records / results store (AlexNet's constants only hold for ImageNet). The ``ce_baseline``
column says which baseline a row used.
"""
from __future__ import annotations

import json
import os
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset

from ..imagenet_info import ALEXNET_CLEAN_ERR, ALEXNET_MEAN_ERR, CORRUPTIONS_15, SEVERITIES
from ..metrics import corruption_errors, relative_mean_corruption_error
from ..results import ID_COLUMNS, accuracy_rows
from ..attacks.base import still_correct
from ..errors import without_worker_traceback
from ..health import check_finite
from ..specs import Unit, chunks
from . import Batch, Benchmark, Column, benchmarks

BASELINE_ENV = "ROBUSTBENCH_PID_CE_BASELINE"
# AlexNet's published errors are for ImageNet validation images (ImageNet-C): only these datasets use them.
ALEXNET_DATASETS = ("imagenet", "imagenet-c")
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

    def plan(self, ctx: Any) -> List[Unit]:
        from ..corruptions import check_corruption, corrupt_tta_version

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
        from ..corruptions import corrupt_batch, sample_seed

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

    def summarize(self, records: pd.DataFrame, ce_baseline: Optional[str] = None) -> pd.DataFrame:
        return corruption_rows(records, baseline=ce_baseline)


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


def _errors(g: pd.DataFrame) -> Dict[str, Dict[int, float]]:
    """corruption -> severity -> top-1 error in [0, 1]; the clean error under key 'clean'."""
    out: Dict[str, Dict[int, float]] = {}
    for (c, sev), h in g.groupby(["corruption", "severity"], sort=False):
        out.setdefault(str(c) or "clean", {})[int(sev)] = 1.0 - float(h["correct_top1"].astype(float).mean())
    return out


def _row(base: Dict[str, Any], metric: str, value: float, n: int, attack: str, **extra: Any) -> Dict[str, Any]:
    return {**base, "attack": attack, "eps": 0.0, "metric": metric, "value": float(value), "n": int(n),
            "ci_low": float("nan"), "ci_high": float("nan"), **extra}


def _complete(errs: Dict[str, Dict[int, float]], names: Sequence[str]) -> List[str]:
    return [c for c in names if c in errs and len(errs[c]) == len(SEVERITIES)]


def _baseline_errors(records: pd.DataFrame, baseline: str, key: Dict[str, Any],
                     sample_ids: set) -> Optional[Dict[str, Dict[int, float]]]:
    cand = records[((records["model"] == baseline) | (records["run_id"] == baseline))
                   & (records["dataset"] == key["dataset"])]
    if "split" in cand and "split" in key:
        cand = cand[cand["split"] == key["split"]]
    found = []
    for rid, g in cand.groupby("run_id", sort=True):
        if set(g.loc[g["corruption"] == "", "sample_id"]) == sample_ids:
            found.append((rid, g))
    if not found:
        return None
    if len(found) > 1:
        warnings.warn(f"several runs of CE baseline {baseline!r} match; using {found[-1][0]}")
    return _errors(found[-1][1])


def corruption_rows(records: pd.DataFrame, baseline: Optional[str] = None) -> pd.DataFrame:
    """Tidy rows of corruption records (any benchmark that writes them: corruptions, imagenet_c)."""
    baseline = baseline or os.environ.get(BASELINE_ENV) or None
    parts = [accuracy_rows(records, ("attack", "eps"))]
    keys = [c for c in ID_COLUMNS if c in records.columns]
    rows: List[Dict[str, Any]] = []
    for gkey, g in records.groupby(keys, sort=False, dropna=False):
        base = dict(zip(keys, gkey if isinstance(gkey, tuple) else (gkey,)))
        errs = _errors(g)
        cname = g["corruption"].replace("", "clean")
        n_per = {c: int((cname == c).sum() // max(1, len(errs.get(c, {})))) for c in errs}
        n = n_per.get("clean") or max(n_per.values(), default=0)
        for c, bys in errs.items():
            if c != "clean":
                rows.append(_row(base, f"err_{c}", 100.0 * float(np.mean(list(bys.values()))), n_per[c], c))
        done15 = _complete(errs, CORRUPTIONS_15)
        if len(done15) == len(CORRUPTIONS_15):
            rows.append(_row(base, "mean_err", 100.0 * float(np.mean([np.mean(list(errs[c].values()))
                                                                       for c in done15])), n, "corruptions"))
        per_sev = {c: [errs[c][s] for s in sorted(errs[c])] for c in errs if c != "clean"}
        clean_err = errs.get("clean", {}).get(0)
        if str(base.get("dataset")) in ALEXNET_DATASETS:
            ref: Optional[Dict[str, Any]] = dict(ALEXNET_MEAN_ERR)
            ref_clean: Optional[float] = ALEXNET_CLEAN_ERR
            label = "alexnet"
            names = [c for c in done15]
        elif baseline and str(base.get("model")) != baseline and str(base.get("run_id")) != baseline:
            key = {"dataset": base.get("dataset"), "split": g["split"].iloc[0] if "split" in g else None}
            sids = set(g.loc[g["corruption"] == "", "sample_id"])
            berrs = _baseline_errors(records, baseline, key, sids)
            if berrs is None:
                warnings.warn(f"CE baseline {baseline!r} has no records for dataset {key['dataset']!r} on the same "
                              f"samples in these results; only unnormalized errors are reported")
                ref = None
            else:
                names = [c for c in per_sev if c in berrs and len(berrs[c]) == len(per_sev[c])]
                zero = [c for c in names if np.mean(list(berrs[c].values())) <= 0]
                if zero:
                    warnings.warn(f"CE baseline {baseline!r} makes no errors on {', '.join(zero)}: CE undefined "
                                  f"there (and so mCE); evaluate more samples")
                    names = [c for c in names if c not in zero]
                ref = {c: [berrs[c][s] for s in sorted(berrs[c])] for c in names}
                ref_clean = berrs.get("clean", {}).get(0)
                label = baseline
        else:
            ref = None
        if ref is None:
            continue
        ces = corruption_errors({c: per_sev[c] for c in names}, ref)
        for c, v in ces.items():
            rows.append(_row(base, f"ce_{c}", v, n_per[c], c, ce_baseline=label))
        if names and set(CORRUPTIONS_15) <= set(names):
            rows.append(_row(base, "mce", float(np.mean([ces[c] for c in CORRUPTIONS_15])), n, "corruptions",
                             ce_baseline=label))
            if clean_err is not None and ref_clean is not None:
                try:
                    rel = relative_mean_corruption_error({c: per_sev[c] for c in CORRUPTIONS_15}, clean_err,
                                                         {c: ref[c] for c in CORRUPTIONS_15}, ref_clean)
                    rows.append(_row(base, "relative_mce", rel, n, "corruptions", ce_baseline=label))
                except ValueError as exc:
                    warnings.warn(f"relative mCE undefined: {exc}")
    if rows:
        parts.append(pd.DataFrame(rows))
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
