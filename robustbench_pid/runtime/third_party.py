"""Other packages' deprecation warnings go to a debug log, not the screen, unless verbose mode is asked for.

Why: RobustBench's release imports ``timm.models.registry``, ``timm.models.layers`` and ``timm.models.helpers``,
each of which warns (``FutureWarning``) that it moved; a user can change none of that code, and six such lines
before every ``robustbench:`` run turn a one-line ``error:`` into line 7 of 7. Only ``FutureWarning``,
``DeprecationWarning`` and ``PendingDeprecationWarning`` raised from files outside this package are moved; the
project's own warnings and every other category are shown as before. ``ROBUSTBENCH_PID_VERBOSE=1`` shows them all
(the debug log is the ``robustbench_pid.third_party`` logger, for notebooks that configure logging).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

VERBOSE_ENV = "ROBUSTBENCH_PID_VERBOSE"
LOG = logging.getLogger("robustbench_pid.third_party")
DEPRECATIONS = (FutureWarning, DeprecationWarning, PendingDeprecationWarning)
_PACKAGE = Path(__file__).resolve().parent.parent
F = TypeVar("F", bound=Callable[..., Any])


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def _ours(filename: str) -> bool:
    try:
        return _PACKAGE in Path(filename).resolve().parents
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def quiet_deprecations() -> Iterator[None]:
    """Inside the block, deprecation warnings from other packages are logged at DEBUG instead of shown; the
    filters in force still decide which warnings are raised at all (an ``error`` filter still raises)."""
    if verbose():
        yield
        return
    with warnings.catch_warnings(record=True) as caught:
        try:
            yield
        finally:
            kept = []
            for w in caught:
                if issubclass(w.category, DEPRECATIONS) and not _ours(w.filename):
                    LOG.debug("%s:%s: %s: %s", w.filename, w.lineno, w.category.__name__, w.message)
                else:
                    kept.append(w)
    for w in kept:  # shown as they would have been, outside the recording block
        warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)


def quietly(fn: F) -> F:
    """``fn`` run under :func:`quiet_deprecations`."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with quiet_deprecations():
            return fn(*args, **kwargs)
    return run  # type: ignore[return-value]
