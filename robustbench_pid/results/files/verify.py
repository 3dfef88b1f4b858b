"""Checksummed run files: ``records.parquet`` and ``summary.csv`` are read only if they are the
bytes finalize wrote.

Finalize records the sha256 of both files in ``run.json`` (``files_sha256``); every reader of a run
folder (``load_records``/``load_results``, ``table``, ``check``, ``plot``, ``report``, a run's
``summary.csv`` handed over as a CSV or a baseline) hashes them again and compares. A file that does
not match is refused with one line naming it and the fix: both files are derived from the work units
(which carry their own checksums, ``integrity``), so ``robustbench-pid merge RUN`` rebuilds them.

Runs finalized before this existed have no ``files_sha256``: they are read with a warning (like
``units_unverified``), and ``merge`` adds the checksums.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, Optional

from ...errors import UserError
from .integrity import sha256_bytes, warn

FILES_KEY = "files_sha256"
# written by finalize when the run has them: --trace and --analyze attention
EXTRA_FILES = ("trace.parquet", "attention.parquet")
RUN_FILES = ("records.parquet", "summary.csv", *EXTRA_FILES)


class RunFileChecksumError(UserError):
    """A run's records.parquet, summary.csv (or trace/attention file) is not what finalize wrote."""


def _info(run_dir: Path) -> Optional[Dict[str, Any]]:
    try:
        info = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def is_complete(run_dir: Path) -> bool:
    """Has this run folder been finalized (run.json's status "complete", its last write)?"""
    info = _info(Path(run_dir))
    return info is not None and info.get("status") == "complete"


def verify_run_files(run_dir: Path, info: Optional[Dict[str, Any]] = None,
                     names: Iterable[str] = RUN_FILES) -> None:
    """Refuse (RunFileChecksumError) a run file whose bytes differ from the sha256 in run.json;
    warn when the run predates the checksums. Files that are absent are not checked here."""
    run_dir = Path(run_dir)
    info = _info(run_dir) if info is None else info
    if info is None or info.get("status") != "complete":
        return  # only a finalized run has files to verify (incomplete runs are policy of load_runs)
    recorded = info.get(FILES_KEY)
    present = [n for n in names if (run_dir / n).is_file()]
    if not isinstance(recorded, dict):
        if present:
            warn(f"{run_dir}: run.json has no checksums of {', '.join(present)} (written by an older version): "
                 f"used unverified; `robustbench-pid merge {run_dir}` rebuilds them from the units with checksums")
        return
    for name in present:
        want = recorded.get(name)
        if want is None:
            continue
        path = run_dir / name
        if sha256_bytes(path.read_bytes()) != want:
            raise RunFileChecksumError(
                f"{path} does not match the sha256 recorded in run.json (changed or damaged since the run finished); "
                f"refusing to read it. Rebuild it from the work units with `robustbench-pid merge {run_dir}`")


def verify_file(path: Path) -> None:
    """A ``records.parquet`` / ``summary.csv`` given by its own path: verified when it belongs to a
    run folder (a ``run.json`` beside it)."""
    path = Path(path)
    if path.name in RUN_FILES and (path.parent / "run.json").is_file():
        verify_run_files(path.parent, names=(path.name,))

