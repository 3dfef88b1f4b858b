"""User-facing errors: the CLI prints their message (problem + fix) and exits non-zero."""
from __future__ import annotations

import errno
from typing import Any, Iterable, Iterator, Optional

# write failures the user fixes (space, quota, permissions), not bugs: one line, exit 2
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
NO_PERMISSION = (errno.EACCES, errno.EPERM, errno.EROFS)


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


class WriteError(UserError):
    """Writing a result file failed for a reason the user can fix (disk full, permission lost)."""


def write_error(exc: OSError, path: Optional[Any] = None) -> Optional[WriteError]:
    """The one-line error for a disk-full or permission failure writing ``path``; None for others."""
    where = path or exc.filename or "a result file"
    tail = "then re-run the same command: finished work units are kept and reused"
    if exc.errno in DISK_FULL:
        return WriteError(f"no space left on the device (or quota exceeded) while writing {where}: free some space "
                          f"or pass --out on another disk, {tail}")
    if exc.errno in NO_PERMISSION:
        return WriteError(f"permission denied while writing {where}: the folder is no longer writable (restore "
                          f"write access, e.g. chmod u+w, or pass another --out), {tail}")
    return None
