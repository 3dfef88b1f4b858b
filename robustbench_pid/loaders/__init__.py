"""Checkpoint loaders: one registry, one module per source.

A checkpoint spec is ``SCHEME:NAME`` (``embedded:deit_digits``, ``timm:deit_tiny_patch16_224``) or a
local file path (``.pth``/``.pt``/``.bin``/``.safetensors``). Each loader returns a plain state dict
plus provenance (:class:`Loaded`); :func:`load_weights` then adapts it (``module.`` / ``net.``
prefixes, timm's own filter functions such as position-embedding resampling) and loads it strictly,
naming every key that does not fit.

Safety: pickled files are read with ``torch.load(weights_only=True)`` unless the caller opts in with
``allow_pickle=True`` (``--allow-pickle``); a pickle can run arbitrary code while it is read.

Third parties add a scheme through the ``robustbench_pid.loaders`` entry-point group: the entry
point's name is the scheme and it must load to a callable ``fn(name, *, allow_pickle=False)``
returning a :class:`Loaded` (or a plain ``{name: tensor}`` mapping, which is hashed by content).
"""
from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch

from ..errors import CheckpointError
from ..registry import Registry, discover

ENTRY_POINT_GROUP = "robustbench_pid.loaders"


@dataclass(frozen=True)
class Loaded:
    """A state dict read from somewhere, with what we need to record where it came from."""

    state_dict: Dict[str, torch.Tensor]
    path: Optional[str]
    sha256: Optional[str]  # of the file; of the tensors (``state_dict_sha256``) when there is no file
    source: str  # the loader scheme
    wrapper: str = ""  # the key the state dict was found under ('' for a plain state dict)
    notes: Tuple[str, ...] = field(default_factory=tuple)
    registry_name: str = ""  # the name in checkpoints/registry.toml ('' for any other source)
    published_hash: str = ""  # its published sha256 or hash prefix ('' when none)
    # the architecture the weights were made for, where the source records it (embedded manifest, registry),
    # and the architecture arguments they were trained with (None: not recorded)
    made_for: str = ""
    trained_with: Optional[Dict[str, Any]] = None


# scheme -> function(name, *, allow_pickle) -> Loaded
loaders: Registry[Callable[..., Any]] = Registry("checkpoint loader")
_modules_done = False
_plugin_errors: Dict[str, str] = {}


def _discover(refresh_plugins: bool = False) -> None:
    """Register our own loader modules (once) and third-party entry points (again on request)."""
    global _modules_done
    if not _modules_done:
        _modules_done = True
        discover(__name__)
        refresh_plugins = True
    if refresh_plugins:
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in loaders:
                continue
            try:
                loaders.add(ep.name, ep.load())
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the built-in loaders
                _plugin_errors[ep.name] = f"{ep.value}: {type(exc).__name__}: {exc}"


def loader_names() -> List[str]:
    _discover(refresh_plugins=True)
    return loaders.names()


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def state_dict_sha256(sd: Mapping[str, torch.Tensor]) -> str:
    """Content hash of a state dict (names, dtypes, shapes, bytes) for sources that are not one file."""
    h = hashlib.sha256()
    for k in sorted(sd):
        t = sd[k].detach().to("cpu").contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _split_spec(spec: str) -> Tuple[Optional[str], str]:
    scheme, sep, name = spec.partition(":")
    if not sep or len(scheme) < 2 or "/" in scheme or "\\" in scheme:  # "C:\\x" or "./a:b" are paths
        return None, spec
    return scheme, name


def read_checkpoint(spec: str, *, allow_pickle: bool = False, checkpoint_dir: Optional[str] = None) -> Loaded:
    """Resolve a checkpoint spec to a state dict (unwrapped from training checkpoints).

    Order: an existing local path; ``SCHEME:NAME``; a bare name of the released-checkpoint registry
    (looked for in ``checkpoint_dir``, the checkpoints folder, the user cache dir); else a file path."""
    _discover()
    if Path(spec).expanduser().exists():
        return _as_loaded(loaders.get("file")(spec, allow_pickle=allow_pickle), spec, "file")
    scheme, name = _split_spec(spec)
    if scheme is None or scheme == "released":
        from ..hub.released import release_names

        if scheme == "released" or spec in release_names():
            return loaders.get("released")(name, allow_pickle=allow_pickle, checkpoint_dir=checkpoint_dir)
    if scheme is None:
        return _as_loaded(loaders.get("file")(spec, allow_pickle=allow_pickle), spec, "file")
    if scheme not in loaders:
        _discover(refresh_plugins=True)  # a plugin installed after we first looked
    if scheme not in loaders:
        broken = f" (plugin {scheme!r} failed to load: {_plugin_errors[scheme]})" if scheme in _plugin_errors else ""
        raise CheckpointError(
            f"checkpoint {spec!r}: no file of that name and no loader for scheme {scheme!r}{broken}. "
            f"Known schemes: {', '.join(s + ':' for s in loaders.names() if s != 'file')}; or give a local "
            f".pth/.pt/.bin/.safetensors path. Third-party loaders register in the {ENTRY_POINT_GROUP!r} "
            f"entry-point group."
        )
    return _as_loaded(loaders.get(scheme)(name, allow_pickle=allow_pickle), spec, scheme)


def _as_loaded(obj: Any, spec: str, scheme: str) -> Loaded:
    """Accept a plugin's plain mapping as well as a :class:`Loaded`."""
    if isinstance(obj, Loaded):
        return obj
    if isinstance(obj, Mapping):
        sd, wrapper = unwrap(obj, spec)
        sd = tensors_only(sd, spec)
        return Loaded(sd, None, state_dict_sha256(sd), scheme, wrapper)
    raise CheckpointError(f"checkpoint loader {scheme!r} returned {type(obj).__name__}, not a state dict")


def load_weights(net: torch.nn.Module, spec: str, *, allow_pickle: bool = False, strict: bool = True,
                 checkpoint_dir: Optional[str] = None, arch: str = "",
                 arch_kwargs: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Load ``spec`` into ``net``; returns provenance (checkpoint, sha256, strictness, problems).

    Strict (the default) refuses any missing, unexpected or wrongly shaped key, any tensor timm's filter
    had to resize, and weights whose source records another architecture than ``arch`` (PID, RPC and
    FeatScale variants share their base model's keys, so shapes alone cannot tell), naming them all;
    non-strict loads every key that fits and records what did not in ``load_problems``. Architecture
    arguments (``arch_kwargs``) other than those the weights were trained with are an ablation: allowed,
    said in a warning and recorded.
    """
    from .adapt import adapt_state_dict, check_fit

    loaded = read_checkpoint(spec, allow_pickle=allow_pickle, checkpoint_dir=checkpoint_dir)
    sd, adaptations, resized = adapt_state_dict(loaded.state_dict, net)
    problems = check_fit(net, sd) + [f"{k} resized by timm's filter to fit: {a} -> {b} (the weights were made for "
                                     f"another input or patch size)" for k, (a, b) in resized.items()]
    if arch and loaded.made_for and loaded.made_for != arch:
        problems.insert(0, f"the weights were made for architecture {loaded.made_for}, not {arch} (--model "
                           f"{loaded.made_for} loads them into that architecture)")
    trained = loaded.trained_with
    changed = ({k: v for k, v in (arch_kwargs or {}).items() if trained.get(k, _DEFAULT) != v}
               if trained is not None else {})
    changed.update({k: _DEFAULT for k in (trained or {}) if k not in (arch_kwargs or {})})
    if changed:
        warnings.warn(f"checkpoint {spec}: evaluated with architecture arguments "
                      f"{', '.join(f'{k}={v!r}' for k, v in changed.items())} other than those it was trained "
                      f"with ({trained or 'the defaults'}): an ablation, recorded in the results", stacklevel=2)
    if problems and strict:
        raise CheckpointError(
            f"checkpoint {spec} does not fit {type(net).__name__}:\n  " + "\n  ".join(problems)
            + "\n(pass --non-strict to load what fits anyway; the problems are then recorded in the results)"
        )
    own = net.state_dict()
    fitting = {k: v for k, v in sd.items() if k in own and own[k].shape == v.shape}
    net.load_state_dict(fitting, strict=False)
    return {
        "checkpoint": loaded.path or spec,
        "checkpoint_sha256": loaded.sha256,
        "checkpoint_name": loaded.registry_name,
        "checkpoint_published_hash": loaded.published_hash,
        "checkpoint_source": loaded.source,
        "checkpoint_format": loaded.wrapper or "state_dict",
        "checkpoint_adaptations": list(loaded.notes) + adaptations,
        "strict": strict,
        "load_problems": problems,
        "loaded_keys": len(fitting),
        **({"checkpoint_trained_with": trained} if trained is not None else {}),
        **({"checkpoint_settings_changed": {k: repr(v) for k, v in changed.items()}} if changed else {}),
    }


class _Default:
    def __repr__(self) -> str:
        return "<the architecture's default>"


_DEFAULT = _Default()


WRAPPER_KEYS = ("model", "state_dict", "model_state_dict", "state_dict_ema", "model_ema")


def unwrap(obj: Any, where: str) -> Tuple[Mapping[str, Any], str]:
    """Find the state dict inside the usual training-checkpoint wrappers; returns (dict, key).

    Order: ``model`` (DeiT release, DeiT/RPC training), ``state_dict`` (timm training),
    ``model_state_dict``, then the EMA copies ``state_dict_ema`` / ``model_ema`` (used only when no
    raw weights are present), else the object itself when it holds tensors.
    """
    if isinstance(obj, Mapping):
        for key in WRAPPER_KEYS:
            if key in obj and isinstance(obj[key], Mapping) and any(isinstance(v, torch.Tensor) for v in obj[key].values()):
                return obj[key], key
        if obj and any(isinstance(v, torch.Tensor) for v in obj.values()):
            return obj, ""
        keys = ", ".join(map(str, list(obj)[:12]))
        raise CheckpointError(f"{where}: no state dict found (looked for a plain state dict or the keys "
                              f"{', '.join(repr(k) for k in WRAPPER_KEYS)}; the file has: {keys or 'nothing'})")
    raise CheckpointError(f"{where}: holds a {type(obj).__name__}, not a state dict (a mapping of parameter "
                          f"names to tensors)")


def tensors_only(sd: Mapping[str, Any], where: str) -> Dict[str, torch.Tensor]:
    out = {str(k): v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    if not out:
        raise CheckpointError(f"{where}: the state dict holds no tensors")
    return out


__all__ = ["Loaded", "ENTRY_POINT_GROUP", "loaders", "loader_names", "load_weights", "read_checkpoint",
           "sha256_file", "state_dict_sha256", "unwrap", "tensors_only"]
