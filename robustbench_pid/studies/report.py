"""``rbp.write_report`` / ``robustbench-pid report``: the result side's HTML report, with a study
folder's table (the paper beside this run's numbers) as its first section. Lives here, not in
results/, because reading a study folder needs the study spec (this layer); torch-free like both."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

from ..results.report.html import write_report as _write_report
from ..results.stats.stats import check_n_boot
from .table import is_study_folder, render_html


def write_report(data: Any, out: Union[str, Path], title: str = "Robustness report", n_boot: int = 1000,
                 ce_baseline: Optional[str] = None, study_dir: Optional[Union[str, Path]] = None) -> Path:
    """One self-contained HTML report; a study folder (``study_dir``, or ``data`` itself when it is
    one folder) gets its table with the paper beside it first."""
    n_boot = check_n_boot(n_boot)
    folder = study_dir if study_dir is not None else (data if isinstance(data, (str, Path)) else None)
    first = [render_html(Path(folder))] if folder is not None and is_study_folder(Path(folder)) else []
    return _write_report(data, out, title=title, n_boot=n_boot, ce_baseline=ce_baseline, first=first)
