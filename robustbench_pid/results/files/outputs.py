"""Output paths of ``table -o``, ``report -o``, ``plot --out`` and their Python functions.

An output path of the wrong kind (a folder where a file is wanted, a file where a folder is wanted,
a file in the way of a parent folder) is one UserError naming it and the fix, before anything is
written; files are written through a temp file and a rename (``run_files.atomic_write_bytes``), so
a failed write leaves neither a half file nor a ``.tmp`` behind.
"""
from __future__ import annotations

from pathlib import Path
from typing import Union

from ...errors import UserError
from .run_files import atomic_write_bytes


def _blocking_file(p: Path) -> Union[Path, None]:
    """The first existing ancestor of ``p`` that is a file (so ``p`` can never be created)."""
    for parent in list(p.parents)[::-1]:
        if parent.exists() and not parent.is_dir():
            return parent
    return None


def output_file(path: Union[str, Path], example: str = "out.txt") -> Path:
    """``path`` as a file to write, or UserError: it is a folder, or a file stands where a folder must be."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"output {p} is a folder, but a file is written there: give a file name, e.g. {p / example}")
    block = _blocking_file(p)
    if block is not None:
        raise UserError(f"cannot write {p}: {block} is a file, not a folder; choose another output path")
    return p


def output_dir(path: Union[str, Path]) -> Path:
    """``path`` as a folder to write files into, or UserError when a file stands there (or above)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UserError(f"output {p} is a file, but a folder is written there (one file per plot and format): "
                        f"give a folder, e.g. --out {p.with_suffix('')}_plots/")
    block = _blocking_file(p)
    if block is not None:
        raise UserError(f"cannot create the folder {p}: {block} is a file, not a folder; choose another --out")
    return p


def write_text(path: Union[str, Path], text: str, example: str = "out.txt") -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically after :func:`output_file`'s checks."""
    p = output_file(path, example)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(p, text.encode("utf-8"), durable=False)
    return p
