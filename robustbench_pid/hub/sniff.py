"""What a file saved in a checkpoint's place really is, read from its first bytes, so the error names the cause.

Why: the commonest failure with downloaded checkpoints is a file that is no checkpoint at all. Google Drive answers
a large download with an HTML virus-scan or quota page, which is saved as ``NAME.pt`` (RobustBench's most reported
failure); an interrupted copy leaves an empty file; a repository cloned without Git LFS holds a three-line pointer
where the weights should be. Loading any of them fails deep inside the unpickler with a message about pickles
("weights only load failed", "invalid load key '<'", a bare ``EOFError``) whose advice, ``--allow-pickle``, is
wrong: the file is not a pickle. Only these three kinds (and an XML error page) are named; any other content is
left to the loader, so a real checkpoint is never refused here.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import CheckpointError

HEAD = 4096  # bytes read: enough for an LFS pointer and a page's <title>
LFS = b"version https://git-lfs.github.com/spec/"


@dataclass(frozen=True)
class NotACheckpoint:
    """A file that is plainly no checkpoint: what it is, why that happens, and what the real file is, if it says."""

    what: str  # "an HTML page (title 'Google Drive - Virus scan warning')"
    cause: str  # "a download that returned a web page instead of the file ..."
    size: Optional[int] = None  # the real file's size, where the stand-in says it (an LFS pointer does)
    sha256: str = ""


def sniff(path: Path) -> Optional[NotACheckpoint]:
    """The kind of non-checkpoint ``path`` is, or None when it may be a checkpoint (the loader then decides)."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD)
    except OSError:
        return None  # unreadable: the loader's own error says so
    if not head:
        return NotACheckpoint("an empty file (0 bytes)", "an interrupted download or copy leaves one")
    if head.startswith(LFS):
        text = head.decode("utf-8", "replace")
        oid = re.search(r"^oid sha256:([0-9a-f]{64})$", text, re.M)
        size = re.search(r"^size (\d+)$", text, re.M)
        return NotACheckpoint("a Git LFS pointer (a small text file standing in for the real one)",
                              "the repository was cloned or downloaded without Git LFS, so only the pointer came "
                              "(`git lfs pull` in that clone fetches the file)",
                              int(size.group(1)) if size else None, oid.group(1) if oid else "")
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if start.startswith((b"<!doctype html", b"<html", b"<head", b"<body")) or (
            start.startswith(b"<") and b"<html" in start[:1024]):
        title = re.search(rb"<title[^>]*>(.*?)</title>", head, re.I | re.S)
        named = " ".join(html.unescape(title.group(1).decode("utf-8", "replace")).split())[:80] if title else ""
        return NotACheckpoint(f"an HTML page{f' (title {named!r})' if named else ''}",
                              "the download returned a web page instead of the file (Google Drive's virus-scan or "
                              "quota page is the usual one; a login or error page is another)")
    if start.startswith(b"<?xml"):
        return NotACheckpoint("an XML document", "the server answered with an error document instead of the file "
                                                 "(a storage service's 'access denied' or 'no such key' is the usual "
                                                 "one)")
    return None


def refuse(path: Path, found: NotACheckpoint, *, expected_sha256: str = "", expected_size: Optional[int] = None,
           how: str = "", fix: str = "") -> CheckpointError:
    """The one-line error for a non-checkpoint at ``path``: what it is, that it is no checkpoint, why, and to
    download the file again (with the real file's size and sha256 where the caller or the stand-in knows them,
    and ``how``: where to get it); ``fix`` replaces that last advice where a download is not the remedy."""
    sha = expected_sha256 or found.sha256
    size = expected_size if expected_size is not None else found.size
    known = ", ".join(x for x in (f"{size:,} bytes" if size else "", f"sha256 {sha}" if sha else "") if x)
    fix = fix or (f"Download the file again{f' ({known})' if known else ''}{f' {how}' if how else ''} and put it "
                  f"at {path}")
    return CheckpointError(f"{path} is not a checkpoint: it is {found.what}; {found.cause}. {fix}")


def check(path: Path, **expected: object) -> None:
    """Raise :func:`refuse`'s error when ``path`` is plainly no checkpoint; return quietly otherwise."""
    found = sniff(path)
    if found is not None:
        raise refuse(path, found, **expected)  # type: ignore[arg-type]


# --- a checkpoint that is a file of the right kind but fails to load: objects refused, or damage ---

def _unsupported_global(msg: str) -> str:
    m = re.search(r"Unsupported global: GLOBAL ([\w.]+)", msg)
    return m.group(1) if m else ""


def _well_formed_pickle(path: Path) -> bool:
    """Does the file hold a complete pickle (torch's zip: its ``data.pkl``)? Read statically by
    ``pickletools.genops``, which executes nothing: a file the safe reader refused that parses is
    a pickle of objects; one that does not parse is damaged and ``--allow-pickle`` cannot help."""
    import io
    import pickletools
    import zipfile

    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                names = [n for n in z.namelist() if n.endswith("data.pkl")]
                data = z.read(names[0]) if names else b""
        else:
            data = path.read_bytes()
        ops = list(pickletools.genops(io.BytesIO(data)))
        return bool(ops) and ops[-1][0].name == "STOP"
    except Exception:  # noqa: BLE001 - any parse failure means: not a well-formed pickle
        return False


def _reason(exc: BaseException) -> str:
    """The one line of torch's error that says what is wrong (its weights_only preamble does not)."""
    text = str(exc)
    m = re.search(r"(Unsupported operand[^\n.]*|PytorchStreamReader[^.\n]*|invalid load key[^\n]*|unexpected EOF[^.\n]*)",
                  text)
    return (m.group(1) if m else f"{type(exc).__name__}: {text.strip().splitlines()[0] if text.strip() else ''}")[:200]


def is_read_failure(exc: BaseException) -> bool:
    """Did ``torch.load`` fail to read the file (as opposed to, say, weights that do not fit a model)?"""
    import pickle

    text = str(exc)
    return isinstance(exc, (pickle.UnpicklingError, EOFError)) or any(
        k in text for k in ("Weights only load failed", "PytorchStreamReader", "invalid load key", "unexpected EOF",
                            "Unsupported operand", "Unsupported global"))


def read_failure(path: Path, exc: BaseException, allow_pickle: bool, lead: str = "") -> CheckpointError:
    """The one-line error for a pickle checkpoint ``torch.load`` could not read. Objects the safe reader refuses
    (a global it does not allow, in a well-formed pickle) get the ``--allow-pickle`` advice; anything else (a broken
    zip, a truncated legacy file, garbage) is damage, where unpickling fully would not help: never advise it there.
    ``lead`` names the loader (RobustBench's) before the file."""
    import pickle

    at = f"{lead} {path}" if lead else f"{path}"
    what = _unsupported_global(str(exc))
    refused = what or (isinstance(exc, pickle.UnpicklingError) and "Unsupported operand" not in str(exc)
                       and _well_formed_pickle(path))
    if not allow_pickle and refused:  # objects, not damage
        what = f"it pickles `{what}`" if what else "it uses pickle features beyond tensors"
        return CheckpointError(
            f"{at}: refused to load: {what}, and unpickling such objects can run arbitrary code hidden in the file, "
            f"so only tensors and plain containers are read by default. DeiT and RPC-attention training checkpoints "
            f"pickle an `args` namespace and need this. If you trust the file, pass --allow-pickle (Python: "
            f"allow_pickle=True); safer, re-save its state dict once as .safetensors and load that.")
    return CheckpointError(f"{at}: cannot read checkpoint: the file is corrupt, truncated or not a PyTorch checkpoint "
                           f"({_reason(exc)}). Download or copy it again (compare its sha256 with the source's)")
