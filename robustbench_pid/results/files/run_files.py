"""The run folder on disk: where it goes, atomic writes, finished units, stale temp files, the run lock.

Every file is written to a temp file named after this host and pid, (fsync'ed,) and renamed, so a
``kill -9`` at any moment leaves the old file or the whole new one, and a symlink standing at the
path is replaced by the file, never written through (it could point outside the output folder). The host/pid in temp names
and in claim files is also what tells a live writer from a dead one (:func:`pid_alive`).
No torch here: ``merge`` uses these in processes that never load a model.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Optional

import pandas as pd

from ...errors import UserError, write_error
from .integrity import sha256_bytes
from .units import content_hash
from ...specs import RUNTIME_KEYS, RunSpec

HOST = socket.gethostname()


def default_out(spec: RunSpec, identity: Optional[Dict[str, Any]] = None) -> Path:
    """``identity``: content hashes of model/data objects, so different objects get different folders."""
    names = sorted({a.attack for a in spec.attacks})
    what = (Path(spec.suite).stem if spec.suite else
            "-".join(names) if names and spec.benchmark == "adversarial" else spec.benchmark)
    tag = content_hash({**{k: v for k, v in spec.as_dict().items() if k not in (*RUNTIME_KEYS, "checkpoint_dir")},
                        **({"objects": identity} if identity else {})})[:8]
    name = "_".join(safe_label(str(x)) for x in (spec.model, spec.dataset, what, spec.protocol))
    return Path("results") / f"{name}_{tag}"


def safe_label(label: str) -> str:
    """A label (model, dataset, suite name) as part of one folder name: path separators and other
    characters outside ``[A-Za-z0-9._+=-]`` become ``-`` and leading dots go, so no label can name
    a parent folder (``x/../../escape`` -> ``x-..-..-escape``) or a hidden file."""
    return re.sub(r"[^A-Za-z0-9._+=-]", "-", label).lstrip(".") or "-"


def check_writable(out: Path) -> None:
    """Fail before any work if ``out`` cannot be created/written; creates nothing itself."""
    probe_dir = out
    while not probe_dir.exists() and probe_dir != probe_dir.parent:
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir() or not os.access(probe_dir, os.W_OK | os.X_OK):
        raise UserError(f"cannot write to output folder {out}: {probe_dir} is not a writable folder. "
                        f"Choose another with --out DIR")


def make_out_dir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-probe-{HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666))
        probe.unlink()
    except OSError as exc:
        raise UserError(f"cannot write to output folder {out}: {exc.strerror or exc}. "
                        f"Choose another with --out DIR") from None


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# --- processes ---------------------------------------------------------------------------------------
def proc_start(pid: int) -> Optional[str]:
    """Start time of ``pid`` (Linux), to tell a live process from a recycled pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


# --- atomic files --------------------------------------------------------------------------------
def _tmp_path(path: Path) -> Path:
    # host + pid + random: unique even for processes on different nodes sharing one folder
    return path.with_name(f".{path.name}.{HOST}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def atomic_write_bytes(path: Path, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one, never a part.

    Temp file + rename is what makes a ``kill -9`` harmless; ``durable`` adds an fsync of the
    data before the rename, so a unit also survives a machine crash (the page cache is lost).
    Status files skip it: they are rewritten by the next run anyway.
    """
    tmp = _tmp_path(path)
    try:
        _write_file(tmp, data, durable)
        os.replace(tmp, path)
    except OSError as exc:  # disk full / permission lost: one line naming the file, not a traceback
        err = write_error(exc, path)
        if err is None:
            raise
        raise err from None
    finally:
        with contextlib.suppress(OSError):
            if tmp.exists():
                tmp.unlink()


def _write_file(tmp: Path, data: bytes, durable: bool) -> None:
    """The one place bytes reach the disk (tests inject disk-full / permission faults here)."""
    # a new file only (O_EXCL, no link followed): the temp name is this writer's own, whatever stands in the folder
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())


def parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def write_parquet_atomic(df: pd.DataFrame, path: Path) -> str:
    """Write ``df`` atomically; returns the sha256 of the bytes written (recorded for units)."""
    data = parquet_bytes(df)
    atomic_write_bytes(path, data)
    return sha256_bytes(data)


def write_json(path: Path, obj: Dict[str, Any], durable: bool = False) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, default=str) + "\n").encode(), durable=durable)


def read_json(path: Path) -> Optional[Dict[str, Any]]:
    """The JSON object in ``path``, or None if it is missing or unreadable (being written, torn, or not an object:
    a hand-edited list or string must not reach a reader's ``.get``)."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def unit_done(units_dir: Path, key: str) -> bool:
    return (units_dir / f"{key}.parquet").is_file() and (units_dir / f"{key}.json").is_file()


def clean_stale_temps(d: Path, min_age: float = 3600.0) -> int:
    """Remove temp files that no live writer can own (same host, dead pid; or older than min_age)."""
    n = 0
    for p in d.glob(".*.tmp"):
        parts = p.name.rsplit(".", 4)  # .<name>.<host>.<pid>.<rand>.tmp
        try:
            host, pid = parts[-4], int(parts[-3])
            dead = host == HOST and not pid_alive(pid)
            if dead or time.time() - p.stat().st_mtime > min_age:
                p.unlink()
                n += 1
        except (ValueError, IndexError, OSError):
            continue
    return n


def run_lock(out: Path) -> Any:
    """An inter-process lock for run-level state (run.json, finalize). Falls back to no lock on
    file systems without flock support: finalize is idempotent and every write is atomic."""
    from filelock import FileLock

    lock = FileLock(str(out / ".run.lock"), timeout=600)
    try:
        lock.acquire()
    except (OSError, NotImplementedError):
        return contextlib.nullcontext()
    lock.release()
    return lock
