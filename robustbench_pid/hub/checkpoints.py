"""The embedded checkpoints folder (``checkpoints/`` in the repository, package data in a wheel), its manifest,
and the one way to add a checkpoint to a manifest folder (:func:`commit_checkpoint`).

Why a commit protocol: a checkpoint is a weights file plus its manifest entry (sha256, recipe); a kill or a
full disk between writing one and the other left a model that no longer loads. New weights go to a new file
whose name carries its sha256 prefix (``NAME-<12 hex>.safetensors``, torch.hub's convention), so writing them
never touches a file any manifest names; the manifest is then replaced in one atomic rename, the single
commit point; only after it is the file the old entry named removed. A crash at any step leaves the old
checkpoint and entry, or the new ones, whole (at worst an unreferenced file).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Dict

from ..core.shipped import shipped_dir
from ..errors import DISK_FULL, NO_PERMISSION, CheckpointError

MANIFEST = "manifest.json"
SHA256 = re.compile(r"^[0-9a-f]{64}$")


# no environment override: which weights ``embedded:NAME`` loads is part of the package, never of the shell
def checkpoints_dir() -> Path:
    return shipped_dir("embedded_checkpoints")


def _damaged(path: Path, why: str) -> CheckpointError:
    fix = ("restore the shipped file (`git checkout -- checkpoints/manifest.json`, or reinstall the package)"
           if path.parent.resolve() == checkpoints_dir().resolve() else
           "restore it from a copy, or delete the folder and train into it again")
    return CheckpointError(f"{path}: {why}; {fix}")


def read_manifest(folder: Path | None = None) -> Dict[str, Dict[str, Any]]:
    """The manifest of ``folder`` (default: the embedded checkpoints), checked: a JSON object of entries, each an
    object with a plain ``file`` name and a 64-hex ``sha256``. Missing file: no entries."""
    path = (folder or checkpoints_dir()) / MANIFEST
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise _damaged(path, "the manifest is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise _damaged(path, f"the manifest is not valid JSON ({'empty' if not path.stat().st_size else exc.msg} "
                             f"at line {exc.lineno}: truncated or hand-edited)") from None
    if not isinstance(data, dict):
        raise _damaged(path, f"the manifest must be a JSON object of checkpoint entries, not {type(data).__name__}")
    for name, entry in data.items():
        if not isinstance(entry, dict):
            raise _damaged(path, f"entry {name!r} must be an object, not {type(entry).__name__}")
        file, sha = entry.get("file"), entry.get("sha256")
        if not isinstance(file, str) or not file or Path(file).name != file or file in (".", ".."):
            raise _damaged(path, f"entry {name!r} has no plain file name in 'file' (got {file!r})")
        if not isinstance(sha, str) or not SHA256.match(sha):
            raise _damaged(path, f"entry {name!r} has no sha256 (64 hex digits) in 'sha256' (got {sha!r})")
    return data


def manifest_entry(name: str) -> Dict[str, Any]:
    manifest = read_manifest()
    if name not in manifest:
        valid = ", ".join(sorted(manifest)) or "(none: train them with `robustbench-pid train`)"
        raise CheckpointError(f"no embedded checkpoint {name!r} in {checkpoints_dir() / MANIFEST}. Valid: {valid}")
    return manifest[name]


def _write_failed(exc: OSError, folder: Path) -> CheckpointError:
    if exc.errno in DISK_FULL:
        why = "no space left on the device (or quota exceeded)"
        fix = "free some space or pass another --out"
    elif exc.errno in NO_PERMISSION:
        why = "permission denied"
        fix = "make the folder writable or pass another --out"
    else:
        why, fix = f"{type(exc).__name__}: {exc.strerror or exc}", "check the folder, or pass another --out"
    return CheckpointError(f"could not write the checkpoint into {folder}: {why}; nothing was changed there: the "
                           f"previous checkpoint and manifest entry (if any) are intact; {fix}")


def _fsync_write(path: Path, write: Callable[[Path], None]) -> None:
    write(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_checkpoint(folder: Path, name: str, save: Callable[[Path], None], entry: Dict[str, Any]) -> Dict[str, Any]:
    """Write a checkpoint (``save(path)`` writes the weights) and its manifest ``entry`` into ``folder`` as one
    transaction (see the module docstring). Returns the entry as recorded, with ``file`` and ``sha256`` set."""
    from filelock import FileLock

    from ..loaders import sha256_file

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise CheckpointError(f"--out {folder} is a file, not a folder; pass a folder (it is created if missing)")
    tmp = folder / f".{name}.{os.getpid()}.tmp"
    final = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        read_manifest(folder)  # a damaged manifest is refused before any work is written
        _fsync_write(tmp, save)
        tmp.chmod(0o644)  # safetensors writes owner-only; the file ships to every user
        digest = sha256_file(tmp)
        final = folder / f"{name}-{digest[:12]}.safetensors"
        os.replace(tmp, final)  # a new name: no manifest refers to it yet
        entry = {**entry, "file": final.name, "sha256": digest}
        with FileLock(str(folder / (MANIFEST + ".lock"))):  # two trainings may finish together
            manifest = read_manifest(folder)
            old = manifest.get(name, {}).get("file")
            manifest[name] = entry
            mtmp = folder / f".{MANIFEST}.{os.getpid()}.tmp"
            _fsync_write(mtmp, lambda p: p.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n"))
            os.replace(mtmp, folder / MANIFEST)  # the commit point
        if old and old != final.name and all(e.get("file") != old for e in manifest.values()):
            try:
                (folder / old).unlink()
            except OSError:
                pass  # an unreferenced old file is harmless
        return entry
    except OSError as exc:
        for p in (tmp, folder / f".{MANIFEST}.{os.getpid()}.tmp"):
            p.unlink(missing_ok=True)
        if final is not None and final.exists() and read_manifest(folder).get(name, {}).get("file") != final.name:
            final.unlink(missing_ok=True)
        raise _write_failed(exc, folder) from None
