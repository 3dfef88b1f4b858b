"""robustbench_pid: adversarial-robustness evaluation for PID, softmax and other vision transformers.

The public names below are loaded on first use (PEP 562), so ``import robustbench_pid`` and the
command line's ``--help`` stay free of torch and timm. Our architectures are registered with timm
by ``import robustbench_pid.models`` (``load_model`` and the runner do it for you).
"""
from __future__ import annotations

import importlib as _importlib
import sys as _sys
from types import ModuleType as _ModuleType
from typing import Any as _Any
from typing import List as _List

from .version import __version__

# public name -> the module that defines it
_LAZY = {
    "load_model": "models",
    "load_dataset": "data",
    "load_records": "results",
    "load_results": "results",
    "evaluate": "api",
    "attack": "api",
    "table": "tables",
    "compare_models": "comparisons",
    "plot_eps_curves": "plots",
    "plot_corruption_errors": "plots",
    "plot_rank_collapse": "plots",
    "write_plots": "plots",
    "write_report": "report",
}

__all__ = ["__version__", *_LAZY, "check"]


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> _List[str]:
    return sorted(n for n in {*globals(), *__all__} if not n.startswith("_") or n.startswith("__"))


class _Package(_ModuleType):
    """``check`` is a submodule and a public function at once: the import system sets
    ``robustbench_pid.check = <module>`` when the submodule is first imported; the public name
    stays the function."""

    @property
    def check(self) -> _Any:
        return _importlib.import_module(f"{__name__}.check").check

    @check.setter
    def check(self, module: _ModuleType) -> None:
        pass  # the submodule stays reachable as sys.modules["robustbench_pid.check"]


_sys.modules[__name__].__class__ = _Package
