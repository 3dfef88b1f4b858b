"""robustbench_pid: adversarial-robustness evaluation for PID, softmax and other vision transformers."""
from __future__ import annotations

__version__ = "0.1.0"

from .models import load_model  # noqa: E402  (also registers our architectures with timm)
from .data import load_dataset  # noqa: E402
from .results import load_records, load_results  # noqa: E402
from .api import attack, evaluate  # noqa: E402
from .comparisons import compare_models  # noqa: E402
from .tables import table  # noqa: E402
from .plots import plot_corruption_errors, plot_eps_curves, plot_rank_collapse, write_plots  # noqa: E402
from .report import write_report  # noqa: E402
from .check import check  # noqa: E402

__all__ = ["__version__", "load_model", "load_dataset", "load_records", "load_results", "evaluate", "attack", "table",
           "compare_models", "plot_eps_curves", "plot_corruption_errors", "plot_rank_collapse", "write_plots",
           "write_report", "check"]
