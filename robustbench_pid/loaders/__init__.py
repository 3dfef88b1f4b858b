"""Checkpoint loaders: one registry, one module per source.

A checkpoint spec is ``SCHEME:NAME`` (``embedded:deit_digits``) or a local file path. Each loader
returns a plain state dict plus provenance; ``load_weights`` then adapts it (format unwrapping,
``module.`` prefixes, timm's filter functions) and loads it strictly, naming every key that does
not fit. Third parties add loaders through the ``robustbench_pid.loaders`` entry-point group.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch

from ..errors import CheckpointError
from ..registry import Registry, discover


@dataclass(frozen=True)
class Loaded:
    state_dict: Dict[str, torch.Tensor]
    path: Optional[str]
    sha256: Optional[str]
    source: str


# scheme -> function(name, allow_pickle) -> Loaded
loaders: Registry[Callable[..., Loaded]] = Registry("checkpoint loader")
_done = False


def _discover() -> None:
    global _done
    if _done:
        return
    _done = True
    discover(__name__)
    for ep in metadata.entry_points(group="robustbench_pid.loaders"):
        if ep.name not in loaders:
            loaders.add(ep.name, ep.load())


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def read_checkpoint(spec: str, *, allow_pickle: bool = False) -> Loaded:
    """Resolve a checkpoint spec to a raw (possibly wrapped) state dict."""
    _discover()
    scheme, sep, name = spec.partition(":")
    if sep and scheme in loaders and not Path(spec).exists():
        return loaders.get(scheme)(name, allow_pickle=allow_pickle)
    return loaders.get("file")(spec, allow_pickle=allow_pickle)


def load_weights(net: torch.nn.Module, spec: str, *, allow_pickle: bool = False, strict: bool = True) -> Dict[str, Any]:
    """Load ``spec`` into ``net``; returns provenance (path, sha256, strictness)."""
    from .adapt import adapt_state_dict, check_fit

    loaded = read_checkpoint(spec, allow_pickle=allow_pickle)
    sd = adapt_state_dict(loaded.state_dict, net)
    problems = check_fit(net, sd)
    if problems and strict:
        raise CheckpointError(
            f"checkpoint {spec} does not fit {type(net).__name__}:\n  " + "\n  ".join(problems)
            + "\n(pass --non-strict to load what fits anyway; that is recorded in the results)"
        )
    own = net.state_dict()
    fitting = {k: v for k, v in sd.items() if k in own and own[k].shape == v.shape}
    net.load_state_dict(fitting, strict=False)
    return {"checkpoint": loaded.path or spec, "checkpoint_sha256": loaded.sha256,
            "checkpoint_source": loaded.source, "strict": strict, "load_problems": problems}


def unwrap(obj: Any, where: str) -> Mapping[str, Any]:
    """Find the state dict inside the usual training-checkpoint wrappers."""
    if isinstance(obj, Mapping):
        for key in ("model", "state_dict", "model_state_dict"):
            if key in obj and isinstance(obj[key], Mapping):
                return obj[key]
        if "state_dict_ema" in obj and isinstance(obj["state_dict_ema"], Mapping):
            return obj["state_dict_ema"]
        if all(isinstance(v, torch.Tensor) for v in obj.values()):
            return obj
    raise CheckpointError(f"{where}: no state dict found (looked for a plain state dict or the keys "
                          f"'model', 'state_dict', 'state_dict_ema')")


def tensors_only(sd: Mapping[str, Any], where: str) -> Dict[str, torch.Tensor]:
    out = {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    if not out:
        raise CheckpointError(f"{where}: the state dict holds no tensors")
    return out


__all__ = ["Loaded", "loaders", "load_weights", "read_checkpoint", "sha256_file", "unwrap", "tensors_only"]
