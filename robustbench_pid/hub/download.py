"""Download one file, resumably, and keep it only if its sha256 matches: what ``robustbench-pid fetch`` does.

The standard library's ``urllib`` does it: one GET with a ``Range`` header is all that resuming needs,
and ``tqdm`` (already a dependency) draws the progress bar, so no HTTP client is added to the
dependencies. (``torch.hub.download_url_to_file`` neither resumes nor keeps a partial file, and
``huggingface_hub`` serves only its hub.)

Bytes go to ``DIR/FILE.part``; a later call resumes it with ``Range: bytes=<size>-`` (a server that
answers 200 instead of 206 sends the whole file again, and the part is restarted). Once complete, the
file's sha256 is checked against the full hash or the hash prefix; only a match is renamed to
``DIR/FILE``. A mismatch deletes the part (resuming a wrong file cannot fix it) and leaves nothing under
the final name. A lock keeps two fetches of one file from writing the same part; its file lives in the
temp folder (``robustbench_pid-locks/``, named by a hash of the destination), never beside the downloads,
where filelock would leave an empty ``.lock`` (it does not delete lock files: that would race).
"""
from __future__ import annotations

import hashlib
import http.client
import os
import re
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

from ..errors import CheckpointError
from .sniff import sniff

CHUNK = 1 << 20
_HEX = re.compile(r"^[0-9a-f]{8,64}$")


def user_cache(name: str, path: Optional[os.PathLike] = None, env: Optional[str] = None) -> Path:
    """A folder of the project's user cache: ``path`` if given, else ``$env`` if set, else
    ``$XDG_CACHE_HOME/robustbench_pid/<name>`` (``~/.cache`` without XDG_CACHE_HOME: the XDG convention)."""
    if path:
        return Path(path).expanduser()
    if env and os.environ.get(env):
        return Path(os.environ[env]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "robustbench_pid" / name


def check_hash_arg(value: str) -> str:
    """A full sha256 (64 hex digits) or a prefix of at least 8, lower-cased."""
    v = value.strip().lower()
    if not _HEX.match(v):
        raise CheckpointError(f"--sha256 {value!r}: expected the file's sha256 (64 hex digits) or at least its "
                              f"first 8 hex digits")
    return v


def _lock_path(final: Path) -> Path:
    """The lock file of one destination: in the temp folder, so the download folder holds only downloads."""
    locks = Path(tempfile.gettempdir()) / "robustbench_pid-locks"
    locks.mkdir(exist_ok=True)
    return locks / (hashlib.sha256(str(final.resolve()).encode()).hexdigest()[:24] + ".lock")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _parse(url: str) -> Any:
    try:
        return urllib.request.urlparse(url)
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket
        raise CheckpointError(f"{url}: not a valid URL ({exc}); give one like https://host/path/file.pth") from None


def file_name(url: str) -> str:
    """The last path segment of ``url`` (no query), which ``fetch URL`` writes under."""
    name = os.path.basename(_parse(url).path)
    if not name or name in (".", ".."):
        raise CheckpointError(f"{url}: the URL names no file; give one that ends in a file name")
    return name


def _open(url: str, offset: int, timeout: float):
    req = urllib.request.Request(url, headers={"User-Agent": "robustbench-pid-fetch",
                                               **({"Range": f"bytes={offset}-"} if offset else {})})
    return urllib.request.urlopen(req, timeout=timeout)  # noqa: S310 - the scheme is checked by download()


def _transfer(url: str, part: Path, progress: bool, timeout: float) -> None:
    """Append the missing bytes of ``url`` to ``part`` (restart it when the server ignores Range)."""
    from tqdm import tqdm

    offset = part.stat().st_size if part.is_file() else 0
    try:
        resp = _open(url, offset, timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:  # nothing after `offset`: the part already holds the whole file
            return
        raise
    with resp:
        status = getattr(resp, "status", 200)
        mode = "ab" if offset and status == 206 else "wb"
        if mode == "wb":
            offset = 0
        length = resp.headers.get("Content-Length")
        total = offset + int(length) if length and length.isdigit() else None
        with open(part, mode) as f, tqdm(total=total, initial=offset, unit="B", unit_scale=True, unit_divisor=1024,
                                         desc=part.name[:-len(".part")], disable=not progress) as bar:
            for block in iter(lambda: resp.read(CHUNK), b""):
                f.write(block)
                bar.update(len(block))
            f.flush()
            os.fsync(f.fileno())
    if total is not None and part.stat().st_size < total:
        raise CheckpointError(f"{url}: the connection ended after {part.stat().st_size} of {total} bytes; "
                              f"{part} is kept: run the same command again to resume")


def download(url: str, dest_dir: Path, name: Optional[str] = None, *, sha256: str, progress: bool = True,
             timeout: float = 60.0) -> Path:
    """``url`` -> ``dest_dir/name`` (default: the URL's file name), verified against ``sha256`` (a full
    hash or a prefix of 8+ hex digits). Resumes ``name.part``; returns the final path."""
    sha256 = check_hash_arg(sha256)
    if _parse(url).scheme not in ("http", "https"):
        raise CheckpointError(f"{url}: only http(s) URLs are fetched; copy a local file yourself")
    name = name or file_name(url)
    dest_dir = Path(dest_dir).expanduser()
    final, part = dest_dir / name, dest_dir / f"{name}.part"
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"cannot create {dest_dir} ({exc.strerror}); pass another folder with --to DIR") from None
    if final.is_file():
        digest = sha256_of(final)
        if digest.startswith(sha256):
            return final
        found = sniff(final)
        what = f" (it is {found.what}, not the file)" if found else ""
        raise CheckpointError(f"{final} already exists and its sha256 {digest} does not match {sha256}{what}; delete "
                              f"it and run the command again")
    from filelock import FileLock, Timeout

    try:
        with FileLock(str(_lock_path(final)), timeout=1):
            if final.is_file() and sha256_of(final).startswith(sha256):  # another fetch finished it meanwhile
                return final
            try:
                _transfer(url, part, progress, timeout)
            except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
                reason = f"HTTP {exc.code} {exc.reason}" if isinstance(exc, urllib.error.HTTPError) else \
                    f"{type(exc).__name__}: {getattr(exc, 'reason', None) or exc}"
                kept = f"; {part} ({part.stat().st_size} bytes) is kept: run the same command again to resume" \
                    if part.is_file() and part.stat().st_size else ""
                raise CheckpointError(f"cannot download {url} ({reason}){kept}") from None
            digest = sha256_of(part)
            if not digest.startswith(sha256):
                found = sniff(part)  # a web page or an error document in the file's place: say which
                part.unlink()
                what = f" (the server sent {found.what}, not the file)" if found else ""
                raise CheckpointError(f"refused {url}: its sha256 {digest} does not match the expected {sha256}"
                                      f"{what}; the download was deleted and nothing was written to {final}")
            os.replace(part, final)
    except Timeout:
        raise CheckpointError(f"another fetch is writing {part} now; wait for it to finish") from None
    return final
