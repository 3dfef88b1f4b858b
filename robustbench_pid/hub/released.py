"""The registry of released checkpoints (``checkpoints/registry.toml``): names, sources, published hashes.

``--checkpoint NAME`` (or ``released:NAME``) and ``robustbench-pid fetch NAME`` read it. A name resolves
to its file in, in order: the folder given with ``--checkpoint-dir`` (Python: ``checkpoint_dir=``), the
checkpoints folder shipped with the package, the user cache dir (``$XDG_CACHE_HOME/robustbench_pid/
checkpoints``, else ``~/.cache/robustbench_pid/checkpoints``). A file is verified against the published
hash before it is read: the full sha256 where one is published, else the prefix its file name carries
(as ``torch.hub`` checks it). Torch-free, so ``fetch`` and ``--help`` start fast.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..errors import CheckpointError
from ..core.paths import SAFE_NAME
from ..core.shipped import shipped_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REGISTRY = "registry.toml"
SCHEME = "released"
_HEX = re.compile(r"^[0-9a-f]*$")
_FIELDS = ("architecture", "model", "file", "urls", "page", "sha256", "hash_prefix", "timm_hub", "paper_table",
           "licence", "format", "evidence")


@dataclass(frozen=True)
class Release:
    """One released file: where it comes from and the hash it must have."""

    name: str
    architecture: str
    model: str
    file: str
    urls: Tuple[str, ...]
    page: str
    sha256: str  # full, lower-case hex; "" when none is published
    hash_prefix: str  # the hex the file name carries; "" when none
    timm_hub: str
    paper_table: str
    licence: str
    format: str
    evidence: str

    @property
    def published_hash(self) -> str:
        """The full sha256 when known, else the prefix, else "" (unknown)."""
        return self.sha256 or self.hash_prefix

    def problem(self, digest: str) -> str:
        """"" when ``digest`` (a file's sha256) matches the published hash (or none is published)."""
        want = self.published_hash
        if want and not digest.lower().startswith(want):
            what = "sha256" if self.sha256 else "hash prefix (from the file name)"
            return f"its sha256 {digest} does not match the published {what} {want}"
        return ""

    def as_dict(self) -> Dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(self).items()}


def registry_path() -> Path:
    return shipped_dir("embedded_checkpoints") / REGISTRY


def _entry(name: str, raw: Any, where: Path) -> Release:
    if not isinstance(raw, dict):
        raise CheckpointError(f"{where}: [{name}] is not a table")
    unknown = sorted(set(raw) - set(_FIELDS))
    missing = [k for k in ("architecture", "file") if not raw.get(k)]
    if unknown or missing:
        raise CheckpointError(f"{where}: [{name}] has unknown field(s) {unknown} or lacks {missing}; fields: "
                              f"{', '.join(_FIELDS)}")
    sha, prefix = str(raw.get("sha256", "")).lower(), str(raw.get("hash_prefix", "")).lower()
    if not _HEX.match(sha) or len(sha) not in (0, 64) or not _HEX.match(prefix) or 0 < len(prefix) < 8:
        raise CheckpointError(f"{where}: [{name}] sha256 must be 64 hex digits or empty, hash_prefix 8+ hex digits "
                              f"or empty")
    if sha and prefix and not sha.startswith(prefix):
        raise CheckpointError(f"{where}: [{name}] sha256 {sha} does not start with its hash_prefix {prefix}")
    urls = raw.get("urls", [])
    if isinstance(urls, str) or not all(isinstance(u, str) and u.startswith(("https://", "http://")) for u in urls):
        raise CheckpointError(f"{where}: [{name}] urls must be a list of http(s) URLs")
    if Path(raw["file"]).name != raw["file"] or raw["file"] in (".", "..") or not SAFE_NAME.fullmatch(raw["file"]):
        # it names the download in --checkpoint-dir / the cache: "..", a path or a hidden name would land elsewhere
        raise CheckpointError(f"{where}: [{name}] file must be a bare file name (letters, digits and . _ + = @ -, not "
                              f"starting with a dot), not {raw['file']!r}")
    return Release(name=name, architecture=raw["architecture"], model=raw.get("model", raw["architecture"]),
                   file=raw["file"], urls=tuple(urls), page=raw.get("page", ""), sha256=sha, hash_prefix=prefix,
                   timm_hub=raw.get("timm_hub", ""), paper_table=raw.get("paper_table", ""),
                   licence=raw.get("licence", ""), format=raw.get("format", ""), evidence=raw.get("evidence", ""))


def read_registry(path: Optional[Path] = None) -> Dict[str, Release]:
    """Every entry of the registry file (the shipped one by default), checked."""
    path = path or registry_path()
    return dict(_read_cached(str(path)))


@lru_cache(maxsize=4)
def _read_cached(path: str) -> Tuple[Tuple[str, Release], ...]:
    p = Path(path)
    if not p.is_file():
        return ()
    try:
        raw = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise CheckpointError(f"{p}: not valid TOML ({exc})") from None
    return tuple((name, _entry(name, entry, p)) for name, entry in sorted(raw.items()))


def release_names() -> List[str]:
    return sorted(read_registry())


def get_release(name: str) -> Release:
    reg = read_registry()
    if name not in reg:
        import difflib

        close = difflib.get_close_matches(name, reg, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise CheckpointError(f"no released checkpoint {name!r} in {registry_path()}.{hint} Known: "
                              f"{', '.join(sorted(reg)) or '(none)'} (`robustbench-pid fetch --list`)")
    return reg[name]


def cache_dir() -> Path:
    """The user cache dir for downloaded checkpoints (XDG base-directory convention)."""
    from .download import user_cache

    return user_cache("checkpoints")


def search_dirs(checkpoint_dir: Optional[str] = None) -> List[Path]:
    """Where a registry name is looked for, in order."""
    dirs = [Path(checkpoint_dir).expanduser()] if checkpoint_dir else []
    return dirs + [shipped_dir("embedded_checkpoints"), cache_dir()]


def find_file(rel: Release, checkpoint_dir: Optional[str] = None) -> Optional[Path]:
    for d in search_dirs(checkpoint_dir):
        if (d / rel.file).is_file():
            return d / rel.file
    return None


def target_dir(checkpoint_dir: Optional[str] = None) -> Path:
    """Where ``fetch`` writes and where the missing-file message says to put the file."""
    return Path(checkpoint_dir).expanduser() if checkpoint_dir else cache_dir()


def fetch_command(rel: Release, checkpoint_dir: Optional[str] = None) -> str:
    to = f" --to {target_dir(checkpoint_dir)}" if checkpoint_dir else ""
    sha = "" if rel.published_hash else " --sha256 HEX"
    return f"robustbench-pid fetch {rel.name}{sha}{to}"


def missing_message(rel: Release, checkpoint_dir: Optional[str] = None) -> str:
    """The one line a user reads when the file of a registry name is not here."""
    where = target_dir(checkpoint_dir) / rel.file
    if rel.urls:
        how = (f"download it with `{fetch_command(rel, checkpoint_dir)}` (from {rel.urls[0]}) or put the file at "
               f"{where}")
        if not rel.published_hash:
            how += " (no hash is published for it: fetch needs --sha256 HEX from the publisher)"
    else:
        how = (f"no direct download URL is recorded; get {rel.file} from {rel.page or 'its publisher'} and put it at "
               f"{where} (no hash is published for it, so it cannot be verified)")
    looked = ", ".join(str(d) for d in search_dirs(checkpoint_dir))
    return f"released checkpoint {rel.name!r} ({rel.architecture}): {rel.file} is not in {looked}; {how}"


def verify_file(rel: Release, path: Path, digest: str) -> None:
    """Refuse a file whose sha256 does not match the registry's published hash."""
    problem = rel.problem(digest)
    if problem:
        raise CheckpointError(f"{path}: refused for released checkpoint {rel.name!r}: {problem}; the file is "
                              f"corrupt, truncated or another file. Delete it and run "
                              f"`robustbench-pid fetch {rel.name}`")
