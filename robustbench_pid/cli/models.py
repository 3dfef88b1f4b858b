"""``robustbench-pid models``: the model zoo, our timm-registered architectures with their arguments
and defaults, the softmax DeiT baselines, and where weights can come from.

Architectures are instantiated on PyTorch's ``meta`` device (no memory, no weights) to read their
size and their model arguments: every dataclass held by the model (``PidGains``, ``RpcConfig``) is
a group of constructor keyword arguments with its defaults.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, is_dataclass
from typing import Any, Dict, List

NAME = "models"
HELP = "list the registered models (zoo aliases, architectures with their arguments and defaults) and checkpoint sources"

BASELINES = ("deit_tiny_patch16_224", "deit_small_patch16_224", "deit_base_patch16_224")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def model_arguments(net: Any) -> Dict[str, Any]:
    """The model's keyword arguments with their values: the fields of the dataclasses it holds."""
    out: Dict[str, Any] = {}
    for value in vars(net).values():
        if is_dataclass(value) and not isinstance(value, type):
            out.update(asdict(value))
    return out


def describe_arch(name: str) -> Dict[str, Any]:
    import timm
    import torch

    with torch.device("meta"):
        net = timm.create_model(name, pretrained=False)
    cfg = getattr(net, "pretrained_cfg", {}) or {}
    patch = getattr(getattr(net, "patch_embed", None), "patch_size", None)
    blocks = getattr(net, "blocks", None)  # None: not a transformer (the CNN), whose depth and heads are '-'
    attn = getattr(blocks[0], "attn", None) if blocks is not None and len(blocks) else None
    return {
        "arch": name,
        "class": type(net).__name__,
        "module": type(net).__module__,
        "input_size": list(cfg.get("input_size", ())),
        "patch_size": list(patch) if patch is not None else None,
        "embed_dim": getattr(net, "embed_dim", None),
        "depth": len(blocks) if blocks is not None else None,
        "num_heads": getattr(attn, "num_heads", None),
        "num_classes": getattr(net, "num_classes", None),
        "params_m": round(sum(p.numel() for p in net.parameters()) / 1e6, 2),
        "arguments": model_arguments(net),
        "doc": (timm.models.model_entrypoint(name).__doc__ or "").strip().splitlines()[0:1],
    }


def our_archs() -> List[str]:
    import timm

    import robustbench_pid.models  # noqa: F401  (registers)

    return sorted(n for n in timm.list_models()
                  if timm.models.model_entrypoint(n).__module__.startswith("robustbench_pid."))


def listing() -> Dict[str, Any]:
    import timm

    from ..hub.checkpoints import read_manifest
    from ..loaders import loader_names
    from ..models.zoo import zoo

    aliases = []
    for name, e in zoo.items():
        aliases.append({
            "name": name, "description": e.description,
            "families": {fam: {"arch": arch, "checkpoint": e.default_checkpoints.get(fam)}
                         for fam, arch in sorted(e.archs.items())},
            "arch_kwargs": dict(e.arch_kwargs),
        })
    return {
        "aliases": aliases,
        "architectures": [describe_arch(n) for n in our_archs()],
        "baselines": [describe_arch(n) for n in BASELINES],
        "embedded_checkpoints": {k: {"arch": v.get("arch"), "sha256": v.get("sha256"),
                                     "clean_test_top1": v.get("clean_test_top1")}
                                 for k, v in sorted(read_manifest().items())},
        "checkpoint_loaders": loader_names(),
        "timm_models": len(timm.list_models()),
    }


def _fmt_args(args: Dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v:g}" if isinstance(v, float)
                     else f"{k}={v}" for k, v in args.items()) or "-"


def _arch_line(a: Dict[str, Any]) -> List[str]:
    size = "x".join(str(s) for s in a["input_size"][1:]) if a["input_size"] else "?"
    patch = a["patch_size"][0] if a["patch_size"] else "-"  # a CNN has no patch, width, blocks or heads

    def v(key: str) -> str:
        return "-" if a[key] is None else str(a[key])

    head = (f"  {a['arch']:<32} {a['class']:<22} {size:>7} p{patch:<3} d{v('embed_dim'):<4} "
            f"L{v('depth'):<3} h{v('num_heads'):<3} {a['num_classes']:>5} cls {a['params_m']:>6.2f}M")
    lines = [head]
    if a["arguments"]:
        lines.append(f"      arguments: {_fmt_args(a['arguments'])}")
    return lines


def render(info: Dict[str, Any]) -> str:
    out: List[str] = ["Model aliases (--model NAME; the architecture depends on the dataset family):"]
    for a in info["aliases"]:
        out.append(f"  {a['name']:<16} {a['description']}")
        for fam, f in a["families"].items():
            ck = f["checkpoint"] or "needs --checkpoint"
            out.append(f"      {fam:<9} {f['arch']:<32} weights: {ck}")
        if a["arch_kwargs"]:
            out.append(f"      arguments: {_fmt_args(a['arch_kwargs'])}")
    out.append("")
    out.append("Architectures registered with timm by robustbench_pid (--model NAME or timm:NAME; "
               "arguments are constructor keywords, shown with their defaults):")
    out.append(f"  {'name':<32} {'class':<22} {'input':>7} {'patch':<4} {'dim':<5} {'dep':<4} {'hds':<4} "
               f"{'classes':>9} {'params':>7}")
    for a in info["architectures"]:
        out.extend(_arch_line(a))
    out.append("")
    out.append("Softmax DeiT baselines (timm's own; `deit` resolves to deit_tiny_patch16_224 on ImageNet):")
    for a in info["baselines"]:
        out.extend(_arch_line(a))
    out.append("")
    out.append(f"Any other timm model: --model timm:NAME ({info['timm_models']} architectures in this timm).")
    out.append("RobustBench's zoo: --model robustbench:NAME (L-inf; robustbench:L2/NAME, robustbench:corruptions/NAME) "
               "on cifar10, cifar100 or imagenet, from RobustBench's model_dir layout (docs/models.md).")
    out.append("")
    out.append("Checkpoints (--checkpoint SPEC): " + ", ".join(
        f"{s}:NAME" for s in info["checkpoint_loaders"] if s != "file") + ", or a local .pth/.pt/.bin/.safetensors "
        "file (pickles need --allow-pickle when they hold more than tensors). Embedded:")
    for k, v in info["embedded_checkpoints"].items():
        acc = f"{100 * v['clean_test_top1']:.2f}% clean test top-1" if v.get("clean_test_top1") is not None else ""
        out.append(f"  embedded:{k:<20} {v['arch']:<28} sha256 {str(v['sha256'])[:12]}  {acc}")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    info = listing()
    print(json.dumps(info, indent=2) if args.json else render(info))
    return 0
