"""Whether a run shows its progress: the command line shows it unless ``--quiet``; in Python a notebook shows it
by default (a cell that runs for minutes must not sit silent) and a script does not (its output is the caller's)."""
from __future__ import annotations

import sys
from typing import Any, Optional


def in_notebook() -> bool:
    """True inside a Jupyter kernel (IPython's ZMQ shell), where tqdm.auto draws a widget bar."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - an IPython without a running shell
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def wants_progress(progress: Optional[bool]) -> bool:
    """``progress=`` as given (True / False), else on in a notebook and off elsewhere."""
    if progress is not None and not isinstance(progress, bool):
        from ..errors import UserError

        raise UserError(f"progress must be True, False or None (on in a notebook), got {progress!r}")
    return in_notebook() if progress is None else progress


FB_COST = 3.0  # a forward+backward to the input in forward passes: doctor's H200 pairs give 2.3 (fp32) to 3.0 (bf16)


def work_of(forward: float, backward: float) -> float:
    """Forward and backward passes as forward-pass equivalents: the progress bar's unit of work."""
    return float(forward) + FB_COST * float(backward)


class LogLines:
    """tqdm's output for a stream that is no terminal (a log file, a pipe): each redraw on a line of its own, where
    carriage returns would pile every update of a run onto one unreadable line."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()
