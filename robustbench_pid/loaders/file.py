"""Local files: ``.safetensors`` (never runs code) and ``.pth``/``.pt``/``.bin``/``.ckpt``/``.pth.tar`` (torch pickles).

Pickles are read with ``torch.load(weights_only=True)``: only tensors and plain containers are
rebuilt, nothing is imported or called. Training checkpoints that pickle other objects (the DeiT and
RPC-attention training scripts save their ``args`` namespace) need the explicit ``allow_pickle``
opt-in (``--allow-pickle``), because a full unpickle can run any code hidden in the file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch

from ..errors import CheckpointError
from ..hub import sniff
from . import Loaded, loaders, sha256_file, tensors_only, unwrap

SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt", ".pth.tar")  # .pth.tar: FAN / timm-train releases


def _suffix(path: Path) -> str:
    return ".pth.tar" if path.name.endswith(".pth.tar") else path.suffix


@loaders.register("file")
def load_file(name: str, *, allow_pickle: bool = False) -> Loaded:
    """Read ``PATH`` or ``PATH#KEY`` (KEY picks a wrapper entry, e.g. ``#state_dict_ema``, ``#model_ema``)."""
    if allow_pickle is not True and allow_pickle is not False:  # "false" is truthy: only a real True opts in
        raise CheckpointError(f"allow_pickle must be True or False, got {allow_pickle!r}")
    path = Path(name).expanduser()
    key = ""
    if not path.is_file() and "#" in name:
        base, key = name.rsplit("#", 1)
        path = Path(base).expanduser()
    if path.is_dir():
        inside = sorted(str(p) for p in path.iterdir() if p.suffix in SUFFIXES)[:5]
        hint = f" (checkpoint files in it: {', '.join(inside)})" if inside else ""
        raise CheckpointError(f"checkpoint {path} is a directory, not a checkpoint file: pass the file itself, e.g. "
                              f"--checkpoint {path}/model.safetensors{hint}")
    if not path.is_file():
        raise CheckpointError(f"checkpoint file not found: {path} (give a local .pth/.pt/.bin/.safetensors file, "
                              f"embedded:NAME, timm:NAME or a released checkpoint's name: robustbench-pid fetch --list)")
    if _suffix(path) not in SUFFIXES:
        raise CheckpointError(f"{path}: unsupported checkpoint format {_suffix(path)!r}; expected one of {', '.join(SUFFIXES)}")
    sniff.check(path)  # an HTML page, an empty file or a Git LFS pointer: say so, never the unpickler's advice
    digest = sha256_file(path)
    notes = []
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file as st_load

        try:
            raw = st_load(str(path), device="cpu")
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(f"{path}: not a readable safetensors file ({exc}): damaged or truncated; "
                                  f"download or copy it again (compare its sha256 with the source's)") from None
    else:
        try:
            raw = torch.load(path, map_location="cpu", weights_only=not allow_pickle)
        except Exception as exc:  # noqa: BLE001
            raise sniff.read_failure(path, exc, allow_pickle) from None
        if allow_pickle:
            notes.append("read with full unpickling (--allow-pickle)")
    if key:
        if not isinstance(raw, Mapping) or key not in raw or not isinstance(raw[key], Mapping):
            found = ", ".join(repr(k) for k, v in raw.items() if isinstance(v, Mapping)) if isinstance(raw, Mapping) else ""
            raise CheckpointError(f"{path}: no state dict under key {key!r} (mappings in the file: {found or 'none'})")
        raw = raw[key]
    sd, wrapper = unwrap(raw, str(path))
    wrapper = key or wrapper
    return Loaded(tensors_only(sd, str(path)), str(path), digest, "file", wrapper, tuple(notes))
