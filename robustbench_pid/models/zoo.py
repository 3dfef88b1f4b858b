"""The user-facing model zoo: short aliases that resolve per dataset family, plus any timm model.

``--model pid_deit`` means the digits PID DeiT on the embedded default and PID DeiT-tiny on
ImageNet; ``--model timm:NAME`` is any timm architecture; a registered timm name works as is.
"""
from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Set

import timm
import torch

from ..errors import UserError
from ..registry import Registry
from .wrapper import Normalized


@dataclass(frozen=True)
class ModelEntry:
    """An alias: which architecture (and default checkpoint) to use for each dataset family."""

    name: str
    description: str
    archs: Dict[str, str]  # family -> timm architecture name
    default_checkpoints: Dict[str, str] = field(default_factory=dict)  # family -> checkpoint spec
    arch_kwargs: Dict[str, Any] = field(default_factory=dict)
    # Eval crop fraction per family where it differs from the architecture's config.
    crop_pct: Dict[str, float] = field(default_factory=dict)


zoo: Registry[ModelEntry] = Registry("model")
# The DeiT repo evaluates all three sizes at crop 0.875 (its eval_crop_ratio); timm's deit configs say 0.9.
DEIT_RELEASE_CROP: Dict[str, float] = {f"deit_{s}_patch16_224": 0.875 for s in ("tiny", "small", "base")}

# The DeiT repo evaluates with Resize 256 / CenterCrop 224 (crop_pct 0.875); timm's deit cfg says 0.9.
zoo.add("deit", ModelEntry(
    "deit", "softmax DeiT (timm's VisionTransformer)",
    archs={"digits": "deit_digits_patch4_32", "imagenet": "deit_tiny_patch16_224"},
    default_checkpoints={"digits": "embedded:deit_digits"},
    crop_pct={"imagenet": 0.875},
))
zoo.add("pid_deit", ModelEntry(
    "pid_deit", "PID DeiT (PIDformer Definition 1; lP .8, lI .5, lD .05, beta .1)",
    archs={"digits": "pid_deit_digits_patch4_32", "imagenet": "pid_deit_tiny_patch16_224"},
    default_checkpoints={"digits": "embedded:pid_deit_digits"},
    crop_pct={"imagenet": 0.875},
))

# The same two architectures trained adversarially (PGD adversarial training at 8/255, the family recipe of
# ``train/recipes.py``): the embedded models a robustness evaluation must not break easily. On ImageNet they
# are the DeiT-tiny architectures and need --checkpoint (your adversarially trained weights).
zoo.add("deit_at", ModelEntry(
    "deit_at", "softmax DeiT, PGD adversarially trained (digits: 8/255)",
    archs={"digits": "deit_digits_patch4_32", "imagenet": "deit_tiny_patch16_224"},
    default_checkpoints={"digits": "embedded:deit_at_digits"},
    crop_pct={"imagenet": 0.875},
))
zoo.add("pid_deit_at", ModelEntry(
    "pid_deit_at", "PID DeiT, PGD adversarially trained (digits: 8/255)",
    archs={"digits": "pid_deit_digits_patch4_32", "imagenet": "pid_deit_tiny_patch16_224"},
    default_checkpoints={"digits": "embedded:pid_deit_at_digits"},
    crop_pct={"imagenet": 0.875},
))


@dataclass(frozen=True)
class ResolvedModel:
    alias: str
    arch: str
    checkpoint: Optional[str]
    arch_kwargs: Dict[str, Any]
    crop_pct: Optional[float]


def resolve_model(model: str, dataset_family: str, checkpoint: Optional[str] = None) -> ResolvedModel:
    """Map an alias / ``timm:NAME`` / ``robustbench:[THREAT/]NAME`` / registered name to an architecture and
    checkpoint (a RobustBench entry's architecture is RobustBench's: ``models/robustbench.py`` builds it)."""
    from .robustbench import is_robustbench, parse

    if is_robustbench(model):
        entry = parse(model, dataset_family)
        return ResolvedModel(entry.alias, entry.alias, checkpoint, {}, 0.875 if entry.dataset == "imagenet" else None)
    if model.startswith("timm:"):
        arch = model[len("timm:"):]
        if not timm.is_model(arch):
            hint = _did_you_mean(arch).replace("Did you mean '", "Did you mean 'timm:")
            raise UserError(f"timm has no model {arch!r}.{hint} List them with "
                            f"`python -c 'import timm; print(timm.list_models())'`")
        return ResolvedModel(model, arch, checkpoint, {}, None)
    if model in zoo:
        entry = zoo.get(model)
        if dataset_family not in entry.archs:
            raise UserError(
                f"model {model!r} has no architecture for {dataset_family!r} datasets "
                f"(it has: {', '.join(sorted(entry.archs))})"
            )
        ckpt = checkpoint or entry.default_checkpoints.get(dataset_family)
        if ckpt is None:
            raise UserError(
                f"model {model!r} on {dataset_family!r} data needs weights: pass --checkpoint PATH "
                f"(a .pth/.pt/.bin/.safetensors file, e.g. the DeiT release or your own training output). "
                f"No weights are downloaded."
            )
        return ResolvedModel(model, entry.archs[dataset_family], ckpt, dict(entry.arch_kwargs),
                             entry.crop_pct.get(dataset_family))
    if timm.is_model(model):  # a registered name: the DeiT releases at the DeiT repo's crop ("timm:" keeps timm's)
        return ResolvedModel(model, model, checkpoint, {}, DEIT_RELEASE_CROP.get(model))
    valid = ", ".join(zoo.names())
    raise UserError(f"unknown model {model!r}.{_did_you_mean(model)} Valid models: {valid}, timm:<any timm name>, "
                    f"robustbench:<entry name>, or a registered timm name (`robustbench-pid models` lists them)")


def _did_you_mean(model: str) -> str:
    """`` Did you mean 'pid_deit'?`` for a close alias (or timm name), as registry names get."""
    import difflib

    bare = model[len("timm:"):] if model.startswith("timm:") else model
    close = difflib.get_close_matches(bare, zoo.names(), n=1, cutoff=0.7)
    if not close:
        close = difflib.get_close_matches(bare, timm.list_models(), n=1, cutoff=0.85)
    return f" Did you mean {close[0]!r}?" if close else ""


def build_model(arch: str, num_classes: Optional[int] = None, **kwargs: Any) -> torch.nn.Module:
    """Create a timm architecture without downloading anything."""
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    return timm.create_model(arch, pretrained=False, **kwargs)


_BUILDER_KWARGS = ("pretrained_cfg", "pretrained_cfg_overlay", "feature_cfg")  # timm's builder takes these
PID_GAINS = ("lambda_p", "lambda_i", "lambda_d", "beta")
# counts and sizes: 0 or less builds nothing sensible (timm fails deep inside, or builds an empty stack)
POSITIVE_ARCH = ("depth", "depths", "num_heads", "embed_dim", "patch_size", "img_size", "in_chans", "mlp_ratio",
                 "num_classes", "num_layers", "width", "head_dim")
# numbers only: JSON's true would be taken as 1 by Python's arithmetic, a string would fail deep in a forward pass
NUMERIC_ARCH = PID_GAINS + POSITIVE_ARCH + ("pap_iterations", "pap_lambda")


def _init_params(cls: type) -> Set[str]:
    """Keyword names ``cls(...)`` accepts, following ``**kwargs`` up the class hierarchy."""
    names: Set[str] = set()
    for c in cls.__mro__:
        init = c.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return names


def check_arch_kwargs(res: "ResolvedModel", kwargs: Dict[str, Any], num_classes: Optional[int]) -> None:
    """Refuse non-finite or unknown architecture arguments before building the model.

    The architecture's class comes from a build on the meta device (no memory, ~0.1 s); what it
    accepts is its ``__init__`` signature plus the factory's own arguments (``factory_kwargs``:
    PID gains, RPC settings). Architectures that cannot be probed are checked by the real build.
    """
    from ..runtime.health import finite_kwargs

    finite_kwargs(kwargs, res.alias)
    if not kwargs:
        return
    if "num_classes" in kwargs:
        raise UserError(f"model {res.alias!r}: the class count comes from the dataset ({num_classes} classes); drop "
                        f"--model-arg num_classes")
    unset = [k for k, v in kwargs.items() if v is None]
    if unset:  # timm drops None keyword arguments: the default would run while None is recorded
        raise UserError(f"model {res.alias!r} ({res.arch}): architecture argument(s) {', '.join(unset)} set to None; "
                        f"give a value or leave them out for the default")
    for k, v in kwargs.items():
        values = v if isinstance(v, (list, tuple)) else [v]
        if k in NUMERIC_ARCH and not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in values):
            raise UserError(f"model {res.alias!r} ({res.arch}): architecture argument {k}={v!r} must be a number; fix "
                            f"--model-arg {k}=NUMBER")
        if k in POSITIVE_ARCH and any(isinstance(x, (int, float)) and not isinstance(x, bool) and x <= 0
                                      for x in values):
            raise UserError(f"model {res.alias!r} ({res.arch}): architecture argument {k}={v!r} must be > 0 (a count "
                            f"or size of the network); fix --model-arg {k}=VALUE")
    try:
        with torch.device("meta"):
            cls = type(build_model(res.arch, num_classes=num_classes))
    except Exception:  # noqa: BLE001 - the real build reports (and wraps) whatever this one hit
        return
    accepted = _init_params(cls) | set(getattr(cls, "factory_kwargs", ())) | set(_BUILDER_KWARGS)
    accepted |= set(getattr(timm.models.model_entrypoint(res.arch), "factory_kwargs", ()))  # e.g. featscale_add
    unknown = [k for k in kwargs if k not in accepted]
    if not unknown:
        return
    what = f"model {res.alias!r} ({res.arch}, {cls.__name__})"
    gains = [k for k in unknown if k in PID_GAINS]
    if gains:
        flags = ", ".join("--" + k.replace("_", "-") for k in gains)
        raise UserError(f"{what} is not a PID model, so it has no PID gains ({flags}): they apply only to PID "
                        f"models such as pid_deit. Drop {flags}, or use --model pid_deit")
    raise UserError(f"{what} has no architecture argument(s) {', '.join(map(repr, unknown))}; valid --model-arg "
                    f"names: {', '.join(sorted(accepted - set(_BUILDER_KWARGS)))}")


def robustness_settings(net: torch.nn.Module) -> Dict[str, Any]:
    """The attention-modification settings a model carries (PID gains, PAP), for provenance."""
    out: Dict[str, Any] = {}
    for attr, key in (("gains", "pid"), ("rpc", "rpc"), ("featscale", "featscale")):
        cfg = getattr(net, attr, None)
        if cfg is not None and hasattr(cfg, "as_dict"):
            out[key] = cfg.as_dict()
    return out


def load_model(
    model: str,
    checkpoint: Optional[str] = None,
    dataset: str = "digits",
    *,
    allow_pickle: bool = False,
    strict: bool = True,
    checkpoint_dir: Optional[str] = None,
    **arch_kwargs: Any,
) -> Normalized:
    """Return the model in eval mode, taking [0, 1] images, with provenance in ``.info``."""
    from ..data import dataset_info
    from ..loaders import load_weights
    from .robustbench import is_robustbench, load_robustbench

    if is_robustbench(model):
        if arch_kwargs:
            raise UserError(f"{model}: a RobustBench entry's architecture is the entry's own; drop "
                            f"{', '.join(arch_kwargs)} (--model-arg / PID gains)")
        return load_robustbench(model, dataset, checkpoint, checkpoint_dir, allow_pickle)
    info = dataset_info(dataset)
    res = resolve_model(model, info.family, checkpoint)
    kwargs = {**res.arch_kwargs, **arch_kwargs}
    check_arch_kwargs(res, kwargs, info.num_classes)
    try:
        net = build_model(res.arch, num_classes=info.num_classes, **kwargs)
    except Exception as exc:  # noqa: BLE001 - timm fails in many ways on bad sizes (RuntimeError, ...)
        if not arch_kwargs:
            raise
        first = str(exc).strip().split("\n")[0][:200]
        raise UserError(f"model {res.alias!r} ({res.arch}): bad architecture argument(s) "
                        f"{', '.join(f'{k}={v!r}' for k, v in arch_kwargs.items())}: {type(exc).__name__}: {first}. "
                        f"Fix the --model-arg / --lambda-* value(s)") from None
    ckinfo: Dict[str, Any] = {"checkpoint": None, "checkpoint_sha256": None, "checkpoint_name": "",
                              "checkpoint_published_hash": ""}
    if res.checkpoint is None:
        warnings.warn(f"model {res.alias!r} ({res.arch}) has no checkpoint: its weights are timm's random "
                      f"initialisation, so its numbers measure nothing trained; pass --checkpoint PATH (Python: "
                      f"checkpoint=...)", stacklevel=2)
    else:
        ckinfo = load_weights(net, res.checkpoint, allow_pickle=allow_pickle, strict=strict,
                              checkpoint_dir=checkpoint_dir, arch=res.arch,
                              arch_kwargs={**kwargs, **robustness_settings(net)})
    cfg = net.pretrained_cfg
    # timm does not update its config's input_size for img_size=: the patch embedding knows what the net takes
    built = getattr(getattr(net, "patch_embed", None), "img_size", None)
    input_size = [cfg["input_size"][0], *built] if built is not None else list(cfg["input_size"])
    wrapped = Normalized(net, cfg["mean"], cfg["std"])
    wrapped.info = {
        "model": res.alias,
        "arch": res.arch,
        "arch_kwargs": {**kwargs, **robustness_settings(net)},
        "num_classes": info.num_classes,
        "mean": list(cfg["mean"]),
        "std": list(cfg["std"]),
        "input_size": [int(v) for v in input_size],
        "interpolation": cfg.get("interpolation"),
        "crop_pct": res.crop_pct if res.crop_pct is not None else cfg.get("crop_pct"),
        "crop_mode": cfg.get("crop_mode") or "center",
        **ckinfo,
    }
    wrapped.eval()
    for p in wrapped.parameters():
        p.requires_grad_(False)
    return wrapped
