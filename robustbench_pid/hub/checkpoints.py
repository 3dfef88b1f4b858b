"""The embedded checkpoints folder (``checkpoints/`` in the repository, package data in a wheel) and its manifest."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict

from ..errors import CheckpointError
from ..core.shipped import shipped_dir

MANIFEST = "manifest.json"
# no environment override: which weights ``embedded:NAME`` loads is part of the package, never of the shell
def checkpoints_dir() -> Path:
    return shipped_dir("embedded_checkpoints")


def read_manifest(folder: Path | None = None) -> Dict[str, Dict[str, Any]]:
    path = (folder or checkpoints_dir()) / MANIFEST
    if not path.is_file():
        return {}
    return json.loads(path.read_text())


def write_manifest_entry(name: str, entry: Dict[str, Any], folder: Path | None = None) -> None:
    from filelock import FileLock

    folder = folder or checkpoints_dir()
    with FileLock(str(folder / (MANIFEST + ".lock"))):  # two trainings may finish together
        manifest = read_manifest(folder)
        manifest[name] = entry
        tmp = folder / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, folder / MANIFEST)


def manifest_entry(name: str) -> Dict[str, Any]:
    manifest = read_manifest()
    if name not in manifest:
        valid = ", ".join(sorted(manifest)) or "(none: train them with `robustbench-pid train`)"
        raise CheckpointError(f"no embedded checkpoint {name!r} in {checkpoints_dir() / MANIFEST}. Valid: {valid}")
    return manifest[name]
