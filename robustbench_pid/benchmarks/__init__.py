"""Benchmarks: one module each. A benchmark plans work units, runs one unit into per-sample
records, and turns records into tidy metric rows. ``adversarial`` (clean + attacks) is the default.
"""
from __future__ import annotations

from dataclasses import dataclass
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
    # the options it reads from ``benchmark_options[name]`` (``--bench-opt KEY=VALUE``): key -> what it does
    options: ClassVar[Dict[str, str]] = {}

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
