"""Adapting a foreign state dict to our model: prefixes, timm's own filter functions, fit checks."""
from __future__ import annotations

import sys
from typing import Dict, List

import torch


def adapt_state_dict(sd: Dict[str, torch.Tensor], net: torch.nn.Module) -> Dict[str, torch.Tensor]:
    sd = {k[len("module."):] if k.startswith("module.") else k: v for k, v in sd.items()}
    own = net.state_dict()
    # Checkpoints saved from our Normalized wrapper carry a "net." prefix and the mean/std buffers.
    if not any(k in own for k in sd) and any(k.startswith("net.") for k in sd):
        sd = {k[len("net."):]: v for k, v in sd.items() if k.startswith("net.")}
    # timm's own filter (position-embedding resampling, layer-scale naming, ...) for the model's module.
    mod = sys.modules.get(type(net).__module__)
    filt = getattr(mod, "checkpoint_filter_fn", None)
    if filt is None:
        from timm.models import vision_transformer as vt

        if isinstance(net, vt.VisionTransformer):
            filt = vt.checkpoint_filter_fn
    if filt is not None:
        try:
            sd = filt(sd, net)
        except Exception:  # noqa: BLE001 - a filter that cannot handle this layout: fall back, check_fit reports
            pass
    return sd


def check_fit(net: torch.nn.Module, sd: Dict[str, torch.Tensor]) -> List[str]:
    """Every key that does not fit, in words (missing, unexpected, wrong shape, class count)."""
    own = net.state_dict()
    problems: List[str] = []
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    wrong = [k for k in sd if k in own and own[k].shape != sd[k].shape]
    head = getattr(net, "default_cfg", {}).get("classifier", "head")
    if f"{head}.weight" in wrong:
        problems.append(
            f"class-count mismatch: checkpoint head has {sd[f'{head}.weight'].shape[0]} classes, "
            f"model has {own[f'{head}.weight'].shape[0]}"
        )
    if missing:
        problems.append("missing keys: " + ", ".join(missing))
    if unexpected:
        problems.append("unexpected keys: " + ", ".join(unexpected))
    if wrong:
        problems.append("wrong shapes: " + ", ".join(
            f"{k} (checkpoint {tuple(sd[k].shape)} vs model {tuple(own[k].shape)})" for k in wrong))
    return problems
