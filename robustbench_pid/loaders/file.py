"""Local files: ``.safetensors`` (never runs code) and ``.pth``/``.pt``/``.bin`` (torch pickles).

Pickles are read with ``torch.load(weights_only=True)``: only tensors and plain containers.
Training checkpoints that pickle other objects (DeiT/RPC ``args`` namespaces) need the explicit
``allow_pickle`` opt-in (``--allow-pickle``), because an arbitrary pickle can run any code on load.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..errors import CheckpointError
from . import Loaded, loaders, sha256_file, tensors_only, unwrap

SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt")


@loaders.register("file")
def load_file(name: str, *, allow_pickle: bool = False) -> Loaded:
    path = Path(name).expanduser()
    if not path.is_file():
        raise CheckpointError(f"checkpoint file not found: {path} (give a local .pth/.pt/.bin/.safetensors file "
                              f"or embedded:NAME)")
    if path.suffix not in SUFFIXES:
        raise CheckpointError(f"{path}: unsupported checkpoint format {path.suffix!r}; expected one of {', '.join(SUFFIXES)}")
    digest = sha256_file(path)
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
            msg = str(exc).split("\n")[0]
            if not allow_pickle and ("weights_only" in str(exc) or "Unsupported global" in str(exc)):
                raise CheckpointError(
                    f"{path}: refused to unpickle non-tensor objects ({msg}). Training checkpoints "
                    f"(DeiT/RPC) pickle an `args` namespace, and a pickle can run arbitrary code on load. "
                    f"If you trust this file, pass --allow-pickle (Python: allow_pickle=True); otherwise "
                    f"re-save its state dict as .safetensors."
                ) from None
            raise CheckpointError(f"{path}: cannot read checkpoint ({msg})") from None
    sd = tensors_only(unwrap(raw, str(path)), str(path))
    return Loaded(sd, str(path), digest, "file")
