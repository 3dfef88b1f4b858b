"""Where the files shipped beside the code live: the attack suites and the embedded checkpoints.

In the repository they are top-level folders, ``attacks/`` and ``checkpoints/``, where users read and
copy them. A wheel maps the same folders into the package (``robustbench_pid/attack_suites`` and
``robustbench_pid/embedded_checkpoints``, pyproject's ``package-dir``), so an installed copy finds
them beside its modules. The packaged location wins; a source checkout or editable install falls
back to the repository's folders. One function, so no module guesses a path of its own.
"""
from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # robustbench_pid/ (this file is in core/)
# name inside an installed package -> top-level folder in the repository
_FOLDERS = {"attack_suites": "attacks", "embedded_checkpoints": "checkpoints"}


def shipped_dir(name: str) -> Path:
    """The folder of ``name`` (``attack_suites`` or ``embedded_checkpoints``) for this installation."""
    packaged = _PACKAGE / name
    if packaged.is_dir():
        return packaged
    return _PACKAGE.parent / _FOLDERS[name]
