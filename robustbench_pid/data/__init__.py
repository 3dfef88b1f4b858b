"""Datasets: one module each, registered by name.

Every dataset yields ``(image in [0, 1] as float tensor CxHxW, int label)`` and exposes
``sample_ids`` (stable string ids, recorded per sample) and ``info`` (a ``DatasetInfo``).

A dataset states the splits it has (the first is its default) and its factory's keyword
arguments are the options it takes: ``load_dataset`` refuses any other split or option with
one line naming the valid ones, so nothing the user asked for is silently ignored.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..errors import UserError
from ..registry import Registry


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    family: str  # which architecture family it needs: "digits" or "imagenet"
    num_classes: int
    description: str
    splits: Tuple[str, ...] = ("test",)  # the splits it has; the first is the default
    needs_root: bool = False
    # The benchmark `evaluate` runs on this dataset when --benchmark is not given.
    default_benchmark: str = "adversarial"
    # What a sample is, which decides the benchmarks that can score it (``Benchmark.samples``): "labelled"
    # (an image of one of all ``num_classes``), "restricted" (one of a 200-class subset: masked logits),
    # "ood" (in- and out-of-distribution images) or "corrupted" (ImageNet-C: corruption x severity x image)
    samples: str = "labelled"
    # Builds the dataset: (split, root, model_info, **its options) -> Dataset; no catch-all **kwargs
    factory: Optional[Callable[..., Any]] = field(default=None, compare=False, repr=False)

    @property
    def default_split(self) -> str:
        return self.splits[0]

    def options(self) -> List[str]:
        """The options the factory takes besides split, root and model_info."""
        params = inspect.signature(self.factory).parameters.values()
        return [p.name for p in params if p.kind is p.KEYWORD_ONLY or
                (p.kind is p.POSITIONAL_OR_KEYWORD and p.name not in ("split", "root", "model_info"))]


datasets: Registry[DatasetInfo] = Registry("dataset", package=__name__)

# how each dataset option is spelled on the command line, and why a dataset may not take it
_FLAGS = {"subset": "--subset", "subset_seed": "--subset", "skip_unreadable": "--skip-unreadable",
          "imagenet_root": "--imagenet-root", "sample_list": "a sample list (--suite robustbench)",
          "n_per_cell": "--limit under --suite robustbench-corruptions"}
_WHY = {"subset": "use --limit N for its first N samples",
        "skip_unreadable": "it is held in memory, with no image files that could be unreadable",
        "imagenet_root": "only imagenet-o and imagenet-c read the ImageNet validation root",
        "sample_list": "only imagenet has one: RobustBench's other leaderboards run the whole test set in order",
        "n_per_cell": "only the released corruption data (cifar10-c, cifar100-c, imagenet-c) has cells"}


def dataset_info(name: str) -> DatasetInfo:
    return datasets.get(name)


def resolve_split(name: str, split: Optional[str]) -> str:
    """``split``, or the dataset's default when None; a split the dataset lacks is refused."""
    info = dataset_info(name)
    if split is None:
        return info.default_split
    if split not in info.splits:
        raise UserError(f"dataset {name!r} has no split {split!r}; valid splits: {', '.join(info.splits)} "
                        f"(--split, default {info.default_split})")
    return split


def check_options(name: str, options: Dict[str, Any]) -> None:
    """Refuse options the dataset's factory does not take, naming the flag and the fix."""
    info = dataset_info(name)
    unknown = [k for k in options if k not in info.options()]
    if not unknown:
        return
    k = unknown[0]
    flag = _FLAGS.get(k, f"dataset option {k!r}")
    why = _WHY.get(k, f"its options: {', '.join(info.options()) or 'none'}")
    raise UserError(f"dataset {name!r} does not take {flag} ({why}); drop it")


def check_request(name: str, split: Optional[str], root: Optional[str], options: Dict[str, Any],
                  need_root: bool = True) -> str:
    """The split to read (``split`` or the default), after refusing a split the dataset lacks, a
    missing (unless ``need_root`` is off: a dry run plans without data) or needless ``--data-root`` and
    options its factory does not take."""
    info = dataset_info(name)
    split = resolve_split(name, split)
    if info.needs_root and not root and need_root:
        raise UserError(f"dataset {name!r} needs --data-root DIR (your local copy; nothing is downloaded)")
    if root and not info.needs_root:
        raise UserError(f"dataset {name!r} is built in and reads no --data-root; drop it")
    check_options(name, options)
    return split


def load_dataset(name: str, split: Optional[str] = None, root: Optional[str] = None,
                 model_info: Optional[Dict[str, Any]] = None, **options: Any) -> Any:
    """Return a torch Dataset of ([0, 1] image tensor, label) with ``.sample_ids``
    (``split=None``: the dataset's default split)."""
    split = check_request(name, split, root, options)
    return dataset_info(name).factory(split=split, root=root, model_info=model_info or {}, **options)
