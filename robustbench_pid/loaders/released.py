"""``released:NAME`` (or a bare registry NAME): a released checkpoint from ``checkpoints/registry.toml``.

The file is looked for in ``--checkpoint-dir``, the shipped checkpoints folder and the user cache dir
(:mod:`robustbench_pid.hub.released`); when it is absent, one line names the URL, the ``fetch`` command and
where to put it. Its sha256 is checked against the published hash *before* the file is read (a file
that does not match is refused, never unpickled), then it is read exactly like a local file (same
safety rules). The registry name and the published hash travel with the weights into every record.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Optional

from ..errors import CheckpointError
from ..hub import sniff
from ..hub.released import fetch_command, find_file, get_release, missing_message, verify_file
from . import Loaded, loaders, sha256_file


@loaders.register("released")
def load_released(name: str, *, allow_pickle: bool = False, checkpoint_dir: Optional[str] = None) -> Loaded:
    from .file import load_file

    rel = get_release(name)
    path: Optional[Path] = find_file(rel, checkpoint_dir)
    if path is None:
        raise CheckpointError(missing_message(rel, checkpoint_dir))
    how = f"with `{fetch_command(rel, checkpoint_dir)}`" if rel.urls else f"from {rel.page or 'its publisher'}"
    sniff.check(path, expected_sha256=rel.sha256, how=how)
    verify_file(rel, path, sha256_file(path))
    if not rel.published_hash:  # said before the file is read: with --allow-pickle it would be unpickled unverified
        warnings.warn(f"released checkpoint {name!r} has no published hash in the registry: {path} could not be "
                      f"verified" + ("; it is unpickled because --allow-pickle was given: only do that for a file "
                                     "you trust" if allow_pickle else ""), UserWarning, stacklevel=2)
    got = load_file(str(path), allow_pickle=allow_pickle)
    notes = [f"released checkpoint {name} ({rel.file}; {rel.paper_table or 'no paper table'})"]
    if not rel.published_hash:
        notes.append("no published hash in the registry: the file could not be verified")
    return Loaded(got.state_dict, got.path, got.sha256, "released", got.wrapper, tuple(notes) + got.notes,
                  registry_name=name, published_hash=rel.published_hash, made_for=rel.architecture)
