"""Claims: which live process is computing which unit, without a coordinator.

A unit is claimed by creating ``units/<key>.claim`` with O_EXCL (atomic on local disks and NFS
v3+). A claim whose process is gone (same host: the pid is dead or was reused; any host: no
heartbeat for ``ROBUSTBENCH_PID_CLAIM_TIMEOUT`` seconds, default 600; a background thread
refreshes held claims every ~minute) is taken over. Claims only avoid duplicate work:
correctness rests on the atomic unit writes, and two processes that do compute one unit write
identical records.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from ..errors import UserError
from ..results.files.run_files import HOST, pid_alive, proc_start, read_json, unit_done
from ..specs import Unit


def claim_timeout() -> float:
    try:
        return float(os.environ.get("ROBUSTBENCH_PID_CLAIM_TIMEOUT", "600"))
    except ValueError:
        raise UserError("ROBUSTBENCH_PID_CLAIM_TIMEOUT must be a number of seconds") from None


_ACTIVE_TOKENS: set = set()  # claim tokens of runs alive in this process


class Claims:
    """O_EXCL claim files with heartbeat and stale-claim takeover (see module docstring)."""

    def __init__(self, units_dir: Path, timeout: Optional[float] = None) -> None:
        self.dir = units_dir
        self.timeout = claim_timeout() if timeout is None else timeout
        self.token = uuid.uuid4().hex
        _ACTIVE_TOKENS.add(self.token)
        self.me = {"host": HOST, "pid": os.getpid(), "pid_start": proc_start(os.getpid()), "token": self.token}
        self.held: Dict[str, Path] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def path(self, key: str) -> Path:
        return self.dir / f"{key}.claim"

    def is_stale(self, p: Path) -> bool:
        try:
            age = time.time() - p.stat().st_mtime
        except FileNotFoundError:
            return True
        info = read_json(p)
        if not info:  # being written right now, or garbage left by a crash
            return age > 30
        if info.get("host") == HOST:
            pid = int(info.get("pid", -1))
            if pid == os.getpid():
                return info.get("token") not in _ACTIVE_TOKENS  # left by an earlier run in this process
            if not pid_alive(pid):
                return True
            start = info.get("pid_start")
            if start is not None and proc_start(pid) not in (None, start):
                return True  # pid recycled by another process
        return age > self.timeout

    def try_claim(self, key: str) -> bool:
        p = self.path(key)
        for _ in range(3):
            try:
                fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if not self.is_stale(p):
                    return False
                # Move the stale claim aside atomically: of several processes judging it stale,
                # exactly one rename succeeds; the rest retry the O_EXCL create and lose to it.
                try:
                    os.replace(p, p.with_name(f".{p.name}.stale.{self.token[:8]}"))
                    p.with_name(f".{p.name}.stale.{self.token[:8]}").unlink()
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as f:
                json.dump({**self.me, "time": time.time()}, f)
            with self._lock:
                self.held[key] = p
            return True
        return False

    def release(self, key: str) -> None:
        with self._lock:
            p = self.held.pop(key, None)
        if p is not None:
            info = read_json(p)
            if info is None or info.get("token") == self.token:
                p.unlink(missing_ok=True)

    def release_all(self) -> None:
        for key in list(self.held):
            self.release(key)

    def _beat(self, every: float) -> None:
        while not self._stop.wait(every):
            with self._lock:
                paths = list(self.held.values())
            for p in paths:
                try:
                    os.utime(p)
                except OSError:
                    pass

    def __enter__(self) -> "Claims":
        every = max(0.5, min(60.0, self.timeout / 5))
        self._thread = threading.Thread(target=self._beat, args=(every,), daemon=True, name="claim-heartbeat")
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self.release_all()
        _ACTIVE_TOKENS.discard(self.token)


def _fresh_claims(units_dir: Path, within: float) -> bool:
    now = time.time()
    for p in units_dir.glob("*.claim"):
        try:
            if now - p.stat().st_mtime < within:
                return True
        except FileNotFoundError:
            continue
    return False


def wait_for_units(units_dir: Path, units: Sequence[Unit], quiet: bool) -> None:
    """Poll until every unit is done, or until for the claim timeout no unit has finished and no
    claim has a fresh heartbeat (a rank that hangs): then return and leave the run to ``merge``."""
    last_n, last_t, wait, said = -1, time.time(), 0.5, 0.0
    while True:
        n = sum(unit_done(units_dir, u.key) for u in units)
        if n == len(units):
            return
        if n != last_n:
            last_n, last_t = n, time.time()
            if not quiet and time.time() - said > 60:
                said = time.time()
                print(f"rank 0: waiting for the other ranks ({len(units) - n} units to go)", file=sys.stderr)
        elif time.time() - last_t > claim_timeout() and not _fresh_claims(units_dir, claim_timeout()):
            print(f"rank 0: no unit finished for {claim_timeout():.0f} s; leaving the run for "
                  f"`robustbench-pid merge`", file=sys.stderr)
            return
        time.sleep(wait)
        wait = min(5.0, wait * 1.5)
