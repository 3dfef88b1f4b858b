"""Benchmarks: one module each. A benchmark plans work units, runs one unit into per-sample
records, and turns records into tidy metric rows. ``adversarial`` (clean + attacks) is the default.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, List

import pandas as pd

from ..registry import Registry


@dataclass(frozen=True)
class Unit:
    """A piece of work whose records depend only on what its key hashes."""

    benchmark: str
    attack: str  # "clean", an attack name, or a benchmark-specific condition family
    eps: float
    params: str  # canonical JSON of the settings
    condition: str  # benchmark-specific (e.g. "gaussian_noise/3"); "" for attacks
    start: int  # sample positions [start, stop) within the evaluated set
    stop: int
    key: str = ""


class Benchmark:
    name: ClassVar[str] = ""
    # tidy metric rows are grouped by these record columns
    group_cols: ClassVar[List[str]] = ["attack", "eps"]

    def plan(self, ctx: Any) -> List[Unit]:
        raise NotImplementedError

    def run_unit(self, ctx: Any, unit: Unit) -> pd.DataFrame:
        raise NotImplementedError

    def summarize(self, records: pd.DataFrame) -> pd.DataFrame:
        raise NotImplementedError


benchmarks: Registry[Callable[[], Benchmark]] = Registry("benchmark", package=__name__)


def get_benchmark(name: str) -> Benchmark:
    return benchmarks.get(name)()


def benchmark_names() -> List[str]:
    return benchmarks.names()
