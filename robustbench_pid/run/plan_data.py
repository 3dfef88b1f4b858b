"""What a ``--dry-run`` plans with when the data or the weights are not on this machine.

A plan needs only how many samples there are (and, for ImageNet-C/-O, in which conditions) and a model
of the right architecture: the cost of a pass does not depend on the weights or on the pixels. So a
dry run prices a dataset that is not here at its published size (``PUBLISHED_COUNTS``: ImageNet val
50,000; -C 50,000 per condition x 75; -A 7,500; -R 30,000; -O 2,000 + 10,000 in-distribution; or
``--limit`` / ``--subset``), times its calibration batch on random images of the model's input size,
and builds an architecture without weights when none are given, saying so in the plan
(:func:`plan_notes`). A real run never comes here: it reads its data and weights or stops with the error.
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ..errors import UserError
from ..specs import RunSpec

CIFAR_COUNTS = {"test": 10_000, "train": 50_000}  # the published files, CIFAR-10 and CIFAR-100 alike


class KnownSizeData:
    """A dataset that is not on this machine, as a plan sees it: its published number of samples in its
    conditions, each a seeded random image of the model's input size (only a calibration batch reads any)."""

    def __init__(self, name: str, parts: Sequence[Tuple[str, int]], image_size: Sequence[int], labels: Sequence[int],
                 reason: str, ood: bool = False) -> None:
        self.name, self.parts, self.reason = name, list(parts), reason
        self.image_size = tuple(int(v) for v in image_size)
        self._labels = list(labels)
        self._starts: List[int] = []
        n = 0
        for _, k in self.parts:
            self._starts.append(n)
            n += k
        self._n = n
        self.sample_ids = _Lazy(n, lambda i: f"{self._part(i)[0] or name}/planned-{self._part(i)[1]}")
        if len(self.parts) > 1 or self.parts[0][0]:
            self.conditions = _Lazy(n, lambda i: self._part(i)[0])
        if ood:
            self.ood = _Lazy(n, lambda i: self._part(i)[0] == "ood")
        self.provenance = {"planned_without_data": reason}

    def _part(self, i: int) -> Tuple[str, int]:
        import bisect

        j = bisect.bisect_right(self._starts, i) - 1
        return self.parts[j][0], i - self._starts[j]

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(int(i))
        return torch.rand(self.image_size, generator=g), int(self._labels[int(i) % len(self._labels)])


class _Lazy:
    """A read-only sequence computed per index (ImageNet-C plans 3.75 million sample ids)."""

    def __init__(self, n: int, fn: Any) -> None:
        self.n, self.fn = n, fn

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if not 0 <= int(i) < self.n:
            raise IndexError(i)
        return self.fn(int(i))


def known_parts(spec: RunSpec, options: Dict[str, Any]) -> Optional[List[Tuple[str, int]]]:
    """(condition, samples) of a registered dataset at its published size, ``--subset`` applied as the dataset
    applies it; None when its size is not known here (then a plan needs the data)."""
    from ..core.imagenet_info import CORRUPTIONS_15, PUBLISHED_COUNTS, SEVERITIES

    name, subset = spec.dataset, options.get("subset")
    if name in ("cifar10-c", "cifar100-c"):  # the released arrays: 10,000 per cell, clean first (data/cifar_c.py)
        from ..core.robustbench import corruption_order

        n = options.get("n_per_cell") or CIFAR_COUNTS["test"]
        return [(c, n) for c in (["clean"] if options.get("clean", True) else []) +
                [f"{c}/{s}" for c in corruption_order() for s in SEVERITIES]]
    if name == "imagenet-c":
        n = min(subset, PUBLISHED_COUNTS[name]) if subset else PUBLISHED_COUNTS[name]
        if options.get("sample_list"):  # RobustBench's 5,000 (--suite robustbench-corruptions)
            from ..core.robustbench import imagenet_subset

            n = options.get("n_per_cell") or len(imagenet_subset())
        chosen = options.get("corruptions") or CORRUPTIONS_15
        conds = (["clean"] if options.get("imagenet_root") or options.get("clean") else []) + \
            [f"{c}/{s}" for c in chosen for s in SEVERITIES]
        return [(c, n) for c in conds]
    if name == "imagenet-o":
        n_ood, n_in = PUBLISHED_COUNTS[name], PUBLISHED_COUNTS["imagenet-o-in"]
        if subset:
            k_ood = max(1, round(subset * n_ood / (n_ood + n_in)))
            n_ood, n_in = k_ood, max(1, subset - k_ood)
        return [("in", n_in), ("ood", n_ood)]
    if options.get("sample_list"):
        from ..core.robustbench import imagenet_subset

        return [("", len(imagenet_subset()))]
    n = CIFAR_COUNTS.get(spec.split) if name in ("cifar10", "cifar100") else PUBLISHED_COUNTS.get(name)
    if n is None:
        return None
    return [("", min(subset, n) if subset else n)]


def plan_dataset(spec: RunSpec, options: Dict[str, Any], model_info: Dict[str, Any]) -> Any:
    """The dataset a dry run plans with: the real one when it can be read here, else its published size
    (:class:`KnownSizeData`), naming why no data was read. Digits and the other built-in data are always read."""
    from ..data import dataset_info, load_dataset

    info = dataset_info(spec.dataset)
    if not info.needs_root:
        return load_dataset(spec.dataset, spec.split, spec.data_root, **options, model_info=model_info)
    if spec.data_root:
        try:
            return load_dataset(spec.dataset, spec.split, spec.data_root, **options, model_info=model_info)
        except UserError as exc:
            reason = f"not readable here ({exc})"
    else:
        reason = "not on this machine (no --data-root given)"
    parts = known_parts(spec, options)
    if parts is None:
        raise UserError(f"--dry-run: dataset {spec.dataset!r} is {reason} and its size is not known here; give "
                        f"--data-root DIR (a dry run reads only the file list and one batch)")
    from ..core.imagenet_info import subset_indices

    labels: Sequence[int] = range(info.num_classes)
    mask = {"imagenet-a": "a", "imagenet-r": "r", "imagenet-o": "o"}.get(spec.dataset)
    if mask is not None:
        labels = subset_indices(mask)
    size = model_info.get("input_size") or (3, 224, 224)
    ds = KnownSizeData(spec.dataset, parts, size, labels, reason, ood=spec.dataset == "imagenet-o")
    if mask is not None:
        ds.logit_indices = list(subset_indices(mask))
    return ds


def plan_model(spec: RunSpec) -> torch.nn.Module:
    """The model a dry run prices: the real one when its weights are given (or built in), else the architecture
    with untrained weights (``info["planned_without_weights"]``), since the cost of a pass does not depend on them."""
    from ..data import dataset_info
    from ..models import load_model, resolve_model
    from ..models.robustbench import is_robustbench, load_robustbench

    if is_robustbench(spec.model):  # its architecture is the entry's, built by RobustBench's package
        return load_robustbench(spec.model, spec.dataset, spec.checkpoint, spec.checkpoint_dir, spec.allow_pickle,
                                plan=True)
    try:
        resolve_model(spec.model, dataset_info(spec.dataset).family, spec.checkpoint)
    except UserError as exc:
        if spec.checkpoint is not None or "needs weights" not in str(exc):
            raise
        res = resolve_model(spec.model, dataset_info(spec.dataset).family, "planned-without-weights")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "no checkpoint: random initialisation" is what a plan wants here
            model = load_model(res.arch, None, spec.dataset, **{**res.arch_kwargs, **spec.arch_kwargs})
        model.info.update(model=spec.model, planned_without_weights=True)
        if res.crop_pct is not None:
            model.info["crop_pct"] = res.crop_pct
        return model
    return load_model(spec.model, spec.checkpoint, spec.dataset, allow_pickle=spec.allow_pickle, strict=spec.strict,
                      checkpoint_dir=spec.checkpoint_dir, **spec.arch_kwargs)


def plan_notes(ctx: Any) -> List[str]:
    """What a plan was made without: the data (its size is the published one) and the weights."""
    notes = []
    ds = ctx.dataset
    if isinstance(ds, KnownSizeData):
        parts = "" if len(ds.parts) == 1 else " (" + (
            ", ".join(f"{c} {k:,}" for c, k in ds.parts) if len(ds.parts) <= 3 else
            f"{len(ds.parts)} conditions x {ds.parts[-1][1]:,} images") + ")"
        notes.append(f"no data read: {ctx.spec.dataset} ({ctx.spec.split}) is {ds.reason}; planned at its published "
                     f"size{f' (--subset {ctx.spec.subset})' if ctx.spec.subset else ''}, {len(ds):,} samples{parts}" + (f", of which --limit takes the first {len(ctx.indices):,}"
                                                           if len(ctx.indices) < len(ds) else ""))
        if ctx.spec.dataset == "imagenet-c" and ds.parts[0][0] != "clean":
            notes[-1] += " (no clean condition: it needs --imagenet-root)"
    if ctx.model.info.get("planned_without_weights"):
        from ..data import dataset_info

        notes.append(f"no weights loaded: {ctx.spec.model} on {dataset_info(ctx.spec.dataset).family} data needs "
                     f"--checkpoint for a run; the plan builds its architecture ({ctx.model.info['arch']}) untrained, "
                     f"which costs the same per pass")
    return notes
