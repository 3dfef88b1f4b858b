"""Local files: ``.safetensors`` (never runs code) and ``.pth``/``.pt``/``.bin``/``.ckpt``/``.pth.tar`` (torch pickles).

Pickles are read with ``torch.load(weights_only=True)``: only tensors and plain containers are
rebuilt, nothing is imported or called. Training checkpoints that pickle other objects (the DeiT and
RPC-attention training scripts save their ``args`` namespace) need the explicit ``allow_pickle``
opt-in (``--allow-pickle``), because a full unpickle can run any code hidden in the file.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

import torch

from ..errors import CheckpointError
from . import Loaded, loaders, sha256_file, tensors_only, unwrap

SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt", ".pth.tar")  # .pth.tar: FAN / timm-train releases


def _suffix(path: Path) -> str:
    return ".pth.tar" if path.name.endswith(".pth.tar") else path.suffix


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


def _reason(exc: Exception) -> str:
    """The one line of torch's error that says what is wrong (its weights_only preamble does not)."""
    text = str(exc)
    m = re.search(r"(Unsupported operand[^\n]*|PytorchStreamReader[^.\n]*|invalid load key[^\n]*)", text)
    return (m.group(1) if m else f"{type(exc).__name__}: {text.strip().splitlines()[0] if text.strip() else ''}")[:200]


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
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes): an interrupted download or copy? Copy or save "
                              f"the checkpoint again")
    digest = sha256_file(path)
    notes = []
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file as st_load

        try:
            raw = st_load(str(path), device="cpu")
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    else:
        try:
            raw = torch.load(path, map_location="cpu", weights_only=not allow_pickle)
        except Exception as exc:  # noqa: BLE001
            text = str(exc)
            what = _unsupported_global(text)
            if not allow_pickle and (what or _well_formed_pickle(path)):  # objects, not damage
                what = f"it pickles `{what}`" if what else "it uses pickle features beyond tensors"
                raise CheckpointError(
                    f"{path}: refused to load: {what}, and unpickling such objects can run arbitrary code "
                    f"hidden in the file, so only tensors and plain containers are read by default. DeiT and "
                    f"RPC-attention training checkpoints pickle an `args` namespace and need this. If you "
                    f"trust the file, pass --allow-pickle (Python: allow_pickle=True); safer, re-save its state "
                    f"dict once as .safetensors and load that."
                ) from None
            # anything else (bad opcodes, a broken zip, garbage) is damage, and unpickling it fully
            # would not help: never advise --allow-pickle for it
            raise CheckpointError(f"{path}: cannot read checkpoint: the file is corrupt, truncated or not a PyTorch "
                                  f"checkpoint ({_reason(exc)}). Copy or save it again (compare its sha256 with "
                                  f"the source's)") from None
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
