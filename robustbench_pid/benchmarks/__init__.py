"""Benchmarks: one module each. A benchmark plans work units, runs one unit into per-sample
records; its tidy metric rows come from ``robustbench_pid.results.summaries`` (pandas only, so result
readers never import torch). ``adversarial`` (clean + attacks) is the default.
"""
from __future__ import annotations

from typing import (Any, Callable, ClassVar, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple,
                    Union)

import numpy as np
import pandas as pd
import torch

from ..registry import Registry
from ..specs import Unit


class Batch(NamedTuple):
    """A batch of a unit's samples on the run's device, as ``Context.batches`` yields it."""

    x: torch.Tensor  # never modified in place: the units of a chunk share it
    y: torch.Tensor
    sample_ids: List[str]
    # what the units of one chunk share beyond the images (e.g. the clean logits); None: nothing
    memo: Optional[Dict[str, Any]] = None


# a record column of one batch: per-sample values (a tensor, array or list) or one value for all
Column = Union[torch.Tensor, np.ndarray, Sequence[Any], str, int, float, bool, None]


class Benchmark:
    """A benchmark states what differs: its units (``plan``), its batches (``batches``, the unit's
    samples by default) and one batch's records (``records``); ``run_unit`` is the shared loop."""

    name: ClassVar[str] = ""
    # tidy metric rows are grouped by these record columns
    group_cols: ClassVar[List[str]] = ["attack", "eps"]
    # the options it reads from ``benchmark_options[name]`` (``--bench-opt KEY=VALUE``): key -> what it does
    options: ClassVar[Dict[str, str]] = {}
    # their kinds, checked where they enter: "count" (a whole number >= 1), "counts" / "names" (lists of those)
    option_kinds: ClassVar[Dict[str, str]] = {}
    # the kinds of sample (``DatasetInfo.samples``) it scores correctly: top-1 over all classes is wrong on a
    # 200-class subset, an out-of-distribution image has no true class, an ImageNet-C file is already corrupted
    samples: ClassVar[Tuple[str, ...]] = ("labelled",)

    def plan(self, ctx: Any) -> List[Unit]:
        raise NotImplementedError

    def batches(self, ctx: Any, unit: Unit) -> Iterable[Any]:
        """What ``records`` is called on, batch by batch; each has ``sample_ids``."""
        return ctx.batches(unit)

    def records(self, ctx: Any, unit: Unit, batch: Any) -> Union[Mapping[str, Column], pd.DataFrame]:
        """One batch's records: column -> per-sample values (tensors may stay on the device: they
        are gathered once per unit) or a scalar for every sample; or a finished DataFrame."""
        raise NotImplementedError

    def run_unit(self, ctx: Any, unit: Unit) -> pd.DataFrame:
        """The unit's records, batch after batch, in sample order."""
        parts: List[Union[Mapping[str, Column], pd.DataFrame]] = []
        for batch in self.batches(ctx, unit):
            parts.append(self.records(ctx, unit, batch))
            ctx.advance(len(batch.sample_ids))
        return gather(parts)

    def passes(self, ctx: Any, unit: Unit) -> Tuple[float, float]:
        """(forward-only, forward+backward) passes per sample in the worst case (the dry run's
        estimate): one forward pass unless a benchmark says otherwise."""
        return 1.0, 0.0


def gather(parts: Sequence[Union[Mapping[str, Column], pd.DataFrame]]) -> pd.DataFrame:
    """One frame of the batches' records. Columns that are device tensors in every batch are
    concatenated on the device and copied to the host once per unit (one sync, not one per batch
    and column); the rest are framed per batch as pandas would (scalars broadcast)."""
    if not parts or all(isinstance(p, pd.DataFrame) for p in parts):
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    names = list(parts[0])
    on_device = [k for k in names if all(isinstance(p[k], torch.Tensor) for p in parts)]  # type: ignore[index]
    host = {k: torch.cat([p[k].reshape(-1) for p in parts]).cpu().numpy()  # type: ignore[index]
            for k in on_device}
    rest = pd.concat([pd.DataFrame({k: _host(p[k]) for k in names if k not in host},  # type: ignore[index]
                                   index=range(len(p["sample_id"]))) for p in parts],  # type: ignore[index]
                     ignore_index=True)
    return pd.DataFrame({k: host[k] if k in host else rest[k] for k in names})


def _host(v: Column) -> Any:
    return v.cpu().numpy() if isinstance(v, torch.Tensor) else v


benchmarks: Registry[Callable[[], Benchmark]] = Registry("benchmark", package=__name__)


def get_benchmark(name: str) -> Benchmark:
    return benchmarks.get(name)()


def benchmark_names() -> List[str]:
    return benchmarks.names()


def check_options(name: str, benchmark_options: Dict[str, Any]) -> None:
    """Refuse options the benchmark does not declare: an unknown key would be recorded and change
    unit keys without changing anything else (a typo must not pass as a setting)."""
    from ..errors import UserError

    bench = get_benchmark(name)
    given = benchmark_options.get(name.replace("-", "_"), benchmark_options.get(name)) or {}
    if not isinstance(given, dict):
        raise UserError(f"benchmark options for {name!r} must be a mapping of KEY: VALUE, got {given!r}")
    unknown = [k for k in given if k not in bench.options]
    if unknown:
        valid = ("; valid: " + ", ".join(f"{k} ({v})" for k, v in bench.options.items()) if bench.options
                 else f"; benchmark {name!r} takes no options")
        raise UserError(f"unknown --bench-opt key(s) {', '.join(map(repr, unknown))} for benchmark {name!r}{valid}")
    for key, value in given.items():
        kind = bench.option_kinds.get(key)
        if kind and not _option_ok(kind, value):
            raise UserError(f"--bench-opt {key}={value!r} for benchmark {name!r}: expected {OPTION_KINDS[kind]} "
                            f"({bench.options[key]})")


def check_dataset(name: str, dataset: str) -> None:
    """Refuse a registered dataset whose samples the benchmark would score wrongly, naming the benchmarks that
    fit it (a data object's name only labels its records: it is not checked)."""
    from ..data import datasets
    from ..errors import UserError

    if dataset not in datasets:
        return
    kind = datasets.get(dataset).samples
    if kind in get_benchmark(name).samples:
        return
    fit = [b for b in benchmark_names() if kind in get_benchmark(b).samples and b != "converge"]  # --converge's
    why = {"restricted": "its images belong to a 200-class subset, scored on masked logits",
           "ood": "its out-of-distribution images have no true class",
           "corrupted": "its images are ImageNet-C's corrupted copies, scored per corruption and severity",
           "labelled": "its images are plain labelled images"}.get(kind, f"its samples are {kind!r}")
    raise UserError(f"benchmark {name!r} does not run on dataset {dataset!r} ({why}); use --benchmark "
                    f"{' or '.join(fit)}")


OPTION_KINDS = {"count": "a whole number >= 1", "counts": "a non-empty list of whole numbers >= 1, e.g. [1,3]",
                "names": 'a non-empty list of names, e.g. ["fog"] (leave the option out for the default)'}


def _option_ok(kind: str, value: Any) -> bool:
    """Is ``value`` of ``kind``? (2.5 or true for a count would be truncated to 2 or taken as 1.)"""
    def count(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 1

    if kind == "count":
        return count(value)
    if kind == "counts":  # an empty list would read as "not given", i.e. all of them
        return isinstance(value, list) and bool(value) and all(count(v) for v in value)
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)
