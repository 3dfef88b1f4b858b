"""robustbench_pid: adversarial-robustness evaluation for PID, softmax and other vision transformers."""
from __future__ import annotations

__version__ = "0.1.0"

from .models import load_model  # noqa: E402  (also registers our architectures with timm)
from .data import load_dataset  # noqa: E402
from .results import load_records, load_results  # noqa: E402

__all__ = ["__version__", "load_model", "load_dataset", "load_records", "load_results"]
