"""Per-sample records -> tidy metric rows, one module per benchmark kind, pandas only.

Why not on the benchmark classes: a benchmark also runs models, so importing it imports torch;
reading results (``table``, ``check``, ``plot``, ``report``) must not. Each module here registers
the summarizer of the benchmark(s) whose records it reads, under the benchmark's registered name;
``benchmarks/<name>.py``'s ``summarize`` calls the same function, so the two cannot drift apart.
Adding a benchmark = adding its ``benchmarks/`` module and one module here.

A summarizer is ``fn(records, ce_baseline=None) -> tidy rows`` (``results.TIDY_COLUMNS``; values
in percent unless the benchmark says otherwise); ``ce_baseline`` only matters to corruption
benchmarks, the others ignore it.
"""
from __future__ import annotations

from typing import Callable, Optional

import pandas as pd

from ...registry import Registry

Summarizer = Callable[..., pd.DataFrame]

summarizers: Registry[Summarizer] = Registry("benchmark summary", package=__name__)


def get_summarizer(benchmark: str) -> Summarizer:
    return summarizers.get(benchmark)


def summarize_benchmark(benchmark: str, records: pd.DataFrame, ce_baseline: Optional[str] = None) -> pd.DataFrame:
    """Tidy rows of one benchmark's records."""
    return get_summarizer(benchmark)(records, ce_baseline=ce_baseline)
