"""Fault injection for the runner's write path: make the k-th file write fail like a full disk
(or a folder whose permission was taken away), at the one place bytes reach the disk."""
from __future__ import annotations

import errno
import os
from typing import List, Optional


def target_name(tmp_name: str) -> str:
    """``.<name>.<host>.<pid>.<rand>.tmp`` -> ``<name>``."""
    return tmp_name[1:].rsplit(".", 4)[0]


def fail_write(monkeypatch, at: int, err: int = errno.ENOSPC, only: Optional[str] = None) -> List[str]:
    """From now on, the ``at``-th write (1-based; counting only targets whose name contains
    ``only``) raises ``OSError(err)``. Returns the list of target names written or attempted, in
    order, so a test can also check which files a step writes and in which order."""
    from robustbench_pid.results.files import run_files

    real = run_files._write_file
    seen: List[str] = []

    def faulty(tmp, data, durable):
        name = target_name(tmp.name)
        if only is None or only in name:
            seen.append(name)
            if len(seen) == at:
                raise OSError(err, os.strerror(err))
        real(tmp, data, durable)

    monkeypatch.setattr(run_files, "_write_file", faulty)
    return seen
