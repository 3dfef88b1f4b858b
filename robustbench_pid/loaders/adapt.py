"""Adapting a foreign state dict to our model: prefixes, timm's own filter functions, fit checks.

Position-embedding resampling, patch-embedding resizing and layer-scale renaming are timm's
``checkpoint_filter_fn`` of the model's module (or of ``vision_transformer`` for any ViT); we do not
re-implement them. Every change made to the state dict is returned in words for the provenance.
"""
from __future__ import annotations

import sys
from typing import Dict, List, Tuple

import torch

PREFIXES = ("module.", "_orig_mod.")  # DataParallel/DDP, torch.compile


def _strip(sd: Dict[str, torch.Tensor], prefix: str) -> Dict[str, torch.Tensor]:
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in sd.items()}


def adapt_state_dict(sd: Dict[str, torch.Tensor], net: torch.nn.Module
                     ) -> Tuple[Dict[str, torch.Tensor], List[str], Dict[str, Tuple[Tuple[int, ...], Tuple[int, ...]]]]:
    """Return the state dict ready for ``net``, the list of adaptations made, and the tensors timm's filter
    resized (key -> (shape before, shape after)): a strict load refuses those."""
    notes: List[str] = []
    resized: Dict[str, Tuple[Tuple[int, ...], Tuple[int, ...]]] = {}
    for prefix in PREFIXES:
        if any(k.startswith(prefix) for k in sd):
            sd = _strip(sd, prefix)
            notes.append(f"stripped {prefix!r} prefix")
    own = net.state_dict()
    # Checkpoints saved from our Normalized wrapper carry a "net." prefix and the mean/std buffers.
    if not any(k in own for k in sd) and any(k.startswith("net.") for k in sd):
        sd = {k[len("net."):]: v for k, v in sd.items() if k.startswith("net.")}
        notes.append("took the 'net.' submodule (a saved Normalized wrapper)")
    # Lightning-style wrappers ("model.blocks.0..."): one leading name on every key, none matching.
    if not any(k in own for k in sd):
        heads = {k.split(".", 1)[0] for k in sd}
        if len(heads) == 1 and all("." in k for k in sd):
            prefix = heads.pop() + "."
            stripped = _strip(sd, prefix)
            if any(k in own for k in stripped):
                sd = stripped
                notes.append(f"stripped {prefix!r} prefix (the weights of a wrapping module)")
    filt = _filter_fn(net)
    if filt is not None:
        before = {k: tuple(v.shape) for k, v in sd.items()}
        try:
            filtered = filt(dict(sd), net)
        except Exception as exc:  # noqa: BLE001 - a filter that cannot handle this layout: check_fit reports
            notes.append(f"timm filter {filt.__module__}.{getattr(filt, '__name__', 'filter')} not applied "
                         f"({type(exc).__name__}: {exc})")
        else:
            for k, v in filtered.items():
                if k in before and before[k] != tuple(v.shape):
                    notes.append(f"{k} resized by timm's filter: {before[k]} -> {tuple(v.shape)}")
                    resized[k] = (before[k], tuple(v.shape))
            renamed = sorted(set(filtered) - set(before))
            if renamed:
                notes.append(f"timm's filter renamed/added {len(renamed)} keys (e.g. {renamed[0]})")
            sd = filtered
    return sd, notes, resized


def _filter_fn(net: torch.nn.Module):
    """timm's checkpoint filter for this model: its module's, else ViT's for any VisionTransformer."""
    mod = sys.modules.get(type(net).__module__)
    filt = getattr(mod, "checkpoint_filter_fn", None)
    if filt is None:
        from timm.models import vision_transformer as vt

        if isinstance(net, vt.VisionTransformer):
            filt = vt.checkpoint_filter_fn
    return filt


def check_fit(net: torch.nn.Module, sd: Dict[str, torch.Tensor]) -> List[str]:
    """Every key that does not fit, in words (class count, missing, unexpected, wrong shape)."""
    own = net.state_dict()
    problems: List[str] = []
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    wrong = [k for k in sd if k in own and own[k].shape != sd[k].shape]
    cfg = getattr(net, "pretrained_cfg", None) or getattr(net, "default_cfg", None) or {}
    head = cfg.get("classifier", "head") if isinstance(cfg, dict) else "head"
    if isinstance(head, (tuple, list)):
        head = head[0]
    hw = f"{head}.weight"
    if hw in wrong and sd[hw].ndim >= 1 and own[hw].ndim >= 1 and sd[hw].shape[1:] == own[hw].shape[1:]:
        problems.append(
            f"class-count mismatch: the checkpoint's classifier ({hw}) has {sd[hw].shape[0]} classes but the "
            f"model has {own[hw].shape[0]}; evaluate it on a dataset with {sd[hw].shape[0]} classes, or pass "
            f"--non-strict to load everything except the classifier"
        )
    hint = _layout_hint(own, sd)
    if hint:
        problems.append(hint)
    if missing:
        problems.append(f"missing keys ({len(missing)}): " + ", ".join(missing))
    if unexpected:
        problems.append(f"unexpected keys ({len(unexpected)}): " + ", ".join(unexpected))
    if wrong:
        problems.append(f"wrong shapes ({len(wrong)}): " + ", ".join(
            f"{k} (checkpoint {tuple(sd[k].shape)} vs model {tuple(own[k].shape)})" for k in wrong))
    return problems


def _layout_hint(own: Dict[str, torch.Tensor], sd: Dict[str, torch.Tensor]) -> str:
    """Say in words when a checkpoint's attention layout is the other kind (qkv 2*dim vs 3*dim, FAN with or
    without ``attn.q``) or when FeatScale's per-block scales are on one side only."""
    q, kv = "blocks.0.attn.q.weight", "blocks.0.attn.kv.weight"
    if kv in own and kv in sd and (q in own) != (q in sd):
        return ("the checkpoint has symmetric FAN attention (attn.kv only, no attn.q); load it with --model symfan "
                "or rpc_fan" if q in own else
                "the checkpoint has standard FAN attention (attn.q and attn.kv); load it with --model fan or pid_fan, "
                "not a symmetric-attention FAN")
    scale = "blocks.0.lamb1"
    if (scale in own) != (scale in sd) and ("blocks.0.attn.qkv.weight" in own) and ("blocks.0.attn.qkv.weight" in sd):
        return ("the checkpoint was trained with FeatScale (blocks.*.lamb1/lamb2); load it with --model featscale_deit "
                "or pid_featscale_deit" if scale in sd else
                "the checkpoint has no FeatScale scales (blocks.*.lamb1/lamb2): it is a plain DeiT/PID DeiT one; load it "
                "with --model deit or pid_deit")
    blocks = sorted({int(k.split(".")[1]) for k in sd if k.startswith("blocks.") and k.endswith(".attn.qkv.weight")})
    sym = {b: sd[f"blocks.{b}.attn.qkv.weight"].shape[0] == 2 * sd[f"blocks.{b}.attn.qkv.weight"].shape[-1]
           for b in blocks if sd[f"blocks.{b}.attn.qkv.weight"].ndim == 2}
    mine = {b: own[f"blocks.{b}.attn.qkv.weight"].shape[0] == 2 * own[f"blocks.{b}.attn.qkv.weight"].shape[-1]
            for b in sym if f"blocks.{b}.attn.qkv.weight" in own}
    if sym and len(set(sym.values())) > 1 and mine != {b: sym[b] for b in mine}:
        some = ", ".join(str(b) for b, s in sym.items() if s)
        return (f"the checkpoint mixes symmetric (qkv of 2*dim rows in block(s) {some}) and standard attention, as "
                f"RPC Sym/Asym DeiT checkpoints; load it with --model rpc_symasym_deit")
    k = "blocks.0.attn.qkv.weight"
    if k not in own or k not in sd or own[k].shape == sd[k].shape or sd[k].ndim != 2:
        return ""
    rows, dim = sd[k].shape
    if rows == 2 * dim and own[k].shape[0] == 3 * dim:
        return ("the checkpoint has symmetric attention (qkv of 2*dim rows: k then v, as SymViT/RPC-SymViT "
                "checkpoints); load it with --model symvit or rpc_symvit")
    if rows == 3 * dim and own[k].shape[0] == 2 * dim:
        return ("the checkpoint has standard q/k/v attention (qkv of 3*dim rows, as DeiT/timm ViTs); load it "
                "with --model deit or pid_deit, not a symmetric-attention model")
    return ""
