"""Checksummed work units: a unit's records are used only if they are the bytes that were written.

When a unit is written, the sha256 of its parquet file goes into its ``.json`` (``parquet_sha256``);
every reader (resume, ``merge``, finalize) hashes the parquet again and compares. The unit key
hashes the unit's *settings*; this hashes its *contents*, so a flipped bit that still decodes, a
truncated copy or a hand-edited ``correct_top1`` is caught instead of silently changing a summary.

What happens on a mismatch: units are derivable, so a resuming run deletes the unit (with a
warning line) and computes it again; ``merge`` and finalize stop with an error naming the file
and the fix. Units written before checksums existed (no ``parquet_sha256``) are *unverified*: they
are used, with a warning line, and counted in ``run.json`` (``units_unverified``); delete them to
have them recomputed.
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from ...errors import UserError

CHECKSUM_KEY = "parquet_sha256"
OK, UNVERIFIED, MISMATCH, BAD_META = "ok", "unverified", "mismatch", "bad-meta"


class UnitChecksumError(UserError):
    """A unit's file does not match the checksum recorded when it was written."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def unit_paths(units_dir: Path, key: str) -> Tuple[Path, Path]:
    return units_dir / f"{key}.parquet", units_dir / f"{key}.json"


def check_bytes(meta: Optional[Dict[str, Any]], data: bytes) -> str:
    """OK, UNVERIFIED (no checksum recorded: an older version wrote it), MISMATCH or BAD_META."""
    if not isinstance(meta, dict):
        return BAD_META
    want = meta.get(CHECKSUM_KEY)
    if want is None:
        return UNVERIFIED
    return OK if sha256_bytes(data) == want else MISMATCH


def read_unit_bytes(units_dir: Path, key: str) -> Tuple[str, Optional[bytes], Optional[Dict[str, Any]]]:
    """(state, parquet bytes, metadata) of a finished unit, read once."""
    import json

    parquet, meta_path = unit_paths(units_dir, key)
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        meta = None
    try:
        data = parquet.read_bytes()
    except OSError:
        return BAD_META, None, meta
    return check_bytes(meta, data), data, meta


def problem(state: str, units_dir: Path, key: str) -> str:
    """What is wrong with a unit whose state is MISMATCH or BAD_META, naming the files."""
    parquet, meta = unit_paths(units_dir, key)
    if state == MISMATCH:
        return (f"{parquet} does not match the sha256 recorded in {meta.name} when it was written (changed or "
                f"damaged on disk since)")
    return f"{meta} (the unit's metadata and checksum) is missing or unreadable, so {parquet.name} cannot be verified"


def raise_bad_unit(state: str, units_dir: Path, key: str, label: str) -> None:
    """Stop merge/finalize: a unit that cannot be trusted is never used."""
    parquet, meta = unit_paths(units_dir, key)
    raise UnitChecksumError(f"{problem(state, units_dir, key)}; it was not used. Delete {parquet} and {meta} and "
                            f"re-run the evaluate command with the same --out (or that shard) to recompute "
                            f"{label}, then merge again")


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def warn_unverified(n: int, out: Path) -> None:
    if n:
        warn(f"{n} unit(s) in {out}/units were written by a version without unit checksums and are used "
             f"unverified; delete them (their .parquet and .json) and re-run to recompute them with checksums")
