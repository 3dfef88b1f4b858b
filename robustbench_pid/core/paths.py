"""Names that become one file or folder name inside a folder the harness writes (study rows, ...).

A name taken from a file or an argument and joined to a folder (``out / name``) must stay one entry
of that folder: ``../../x`` or ``/tmp/x`` would write a whole run folder elsewhere, ``.`` and ``..``
would nest runs into their parents. Such names are refused where they enter, with the field named,
rather than rewritten: the same name also selects things (``--only ROW``), so a silent rewrite would
make two names mean one folder.
"""
from __future__ import annotations

import re
from typing import Any

from ..errors import UserError

# what a name that becomes a path may hold: letters, digits and . _ + = @ - (no separators, no spaces)
SAFE_NAME = re.compile(r"[A-Za-z0-9_+=@-][A-Za-z0-9._+=@-]*")


def check_path_name(name: Any, field: str, example: str = "pgd-4") -> str:
    """``name`` itself when it is safe as one folder/file name; else one UserError naming ``field``.

    Safe: letters, digits and ``. _ + = @ -``, not starting with a dot (so never ``.``, ``..`` or a
    hidden file), no path separator, no absolute path, nothing else (spaces and control characters
    included)."""
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name):
        text = name if isinstance(name, str) else ""
        why = ("it is a path (it would write outside its folder)" if "/" in text or "\\" in text else
               "it starts with a dot (., .. and hidden names nest or hide folders)" if text.startswith(".") else
               "it is empty" if not text else "it holds characters a folder name cannot safely have")
        raise UserError(f"{field} {name!r} becomes a folder name, and {why}: use letters, digits and . _ + = @ - "
                        f"only, not starting with a dot, e.g. {example!r}")
    return name


def slug(text: str) -> str:
    """Free text (a study column's name, ``model@column``) as one folder name: every run of characters outside
    ``[A-Za-z0-9_.@+-]`` becomes one ``-`` (column names such as "RPC (4iter/layer1)" hold separators)."""
    return re.sub(r"[^A-Za-z0-9_.@+-]+", "-", text).strip("-")
