"""Datasets: one module each, registered by name.

Every dataset yields ``(image in [0, 1] as float tensor CxHxW, int label)`` and exposes
``sample_ids`` (stable string ids, recorded per sample) and ``info`` (a ``DatasetInfo``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

from ..registry import Registry


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    family: str  # which architecture family it needs: "digits" or "imagenet"
    num_classes: int
    description: str
    splits: tuple = ("test",)
    needs_root: bool = False
    # The benchmark `evaluate` runs on this dataset when --benchmark is not given.
    default_benchmark: str = "adversarial"
    # Builds the dataset: (split, root, model_info, options) -> Dataset
    factory: Optional[Callable[..., Any]] = field(default=None, compare=False, repr=False)


datasets: Registry[DatasetInfo] = Registry("dataset", package=__name__)


def dataset_info(name: str) -> DatasetInfo:
    return datasets.get(name)


def load_dataset(name: str, split: str = "test", root: Optional[str] = None,
                 model_info: Optional[Dict[str, Any]] = None, **options: Any) -> Any:
    """Return a torch Dataset of ([0, 1] image tensor, label) with ``.sample_ids``."""
    from ..errors import UserError

    info = dataset_info(name)
    if split not in info.splits:
        raise UserError(f"dataset {name!r} has no split {split!r}; valid splits: {', '.join(info.splits)}")
    if info.needs_root and not root:
        raise UserError(f"dataset {name!r} needs --data-root DIR (your local copy; nothing is downloaded)")
    return info.factory(split=split, root=root, model_info=model_info or {}, **options)

