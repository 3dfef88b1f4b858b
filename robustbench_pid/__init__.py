"""robustbench_pid: adversarial-robustness evaluation for PID, softmax and other vision transformers.

The public names below are loaded on first use (PEP 562), so ``import robustbench_pid`` and the
command line's ``--help`` stay free of torch and timm. Our architectures are registered with timm
by ``import robustbench_pid.models`` (``load_model`` and the runner do it for you).
"""
from __future__ import annotations

import importlib as _importlib
from typing import Any as _Any
from typing import List as _List

from .core.version import __version__

# public name -> the module that defines it
_LAZY = {
    "load_model": "models",
    "load_dataset": "data",
    "load_records": "results.store",
    "load_attention": "results.report.attention",
    "load_adversarial": "export.adversarial",
    "export_robustbench": "export.robustbench",
    "load_results": "results.store",
    "evaluate": "api",
    "attack": "api",
    "table": "results.tables.layouts",
    "compare_models": "results.tables.comparisons",
    "plot_eps_curves": "results.report.plots",
    "plot_corruption_errors": "results.report.plots",
    "plot_rank_collapse": "results.report.plots",
    "write_plots": "results.report.plots",
    "write_report": "studies.report",
    "check": "results.ci.check",
    "DiagnosticWarning": "results.report.diagnostics",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> _List[str]:
    return sorted(n for n in {*globals(), *__all__} if not n.startswith("_") or n.startswith("__"))
