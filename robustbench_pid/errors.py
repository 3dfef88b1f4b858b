"""User-facing errors: the CLI prints their message (problem + fix) and exits non-zero."""
from __future__ import annotations

from typing import Any, Iterable, Iterator



class UserError(Exception):
    """Bad input from the user: a clear message naming the problem and the fix."""


class CheckpointError(UserError):
    """A checkpoint that is missing, corrupt, unsafe to load, or does not fit the model."""


def without_worker_traceback(batches: Iterable[Any]) -> Iterator[Any]:
    """Re-raise a UserError from a DataLoader worker as the one-line message it started as
    (torch re-raises it with the worker's traceback text folded into the message)."""
    try:
        yield from batches
    except UserError as exc:
        msg = str(exc)
        if "Original Traceback" in msg and "UserError: " in msg:
            raise type(exc)(msg.rstrip().rsplit("UserError: ", 1)[1]) from None
        raise
