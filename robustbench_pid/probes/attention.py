"""What the attention does under attack: per-sample, per-layer metrics of clean and attacked inputs.

One forward pass with hooks per sample and condition, on the points the attack returned (no extra
attack). Layers follow ``analysis``: 0 = the input of the first block (patch + position embeddings),
l = the output of block l (the residual stream). Metrics (``metrics`` has the definitions):

- on every layer 0..L: ``shift`` (||h_l(x_adv) - h_l(x)|| / ||h_l(x)||; 0 on the clean condition),
  ``token_similarity`` (A.6) and ``effective_rank`` of the token matrix;
- on blocks 1..L, read from the block's ``attn`` in a forward pre-hook (the fused SDPA kernels never
  expose the probabilities, so q and k are recomputed from the module's own projections):
  ``attention_entropy``; for PID attention (``gains`` + the controller ``state``) ``pid_error_norm``
  ||e^l||_F and ``pid_share_{attn,p,i,d}`` = ||term||_F / (sum of the four terms' norms), the terms
  being softmax(qk^T)v, lP e^l, lI sum_m e^m and lD (e^l - e^{l-1}); for layers running PAP (RPC)
  ``pap_sparse_norm`` ||S||_F of the sparse part the last iteration removes from the keys and
  ``pap_sparse_fraction`` ||S||_F / ||K||_F.

An attention the probe cannot read (no q/k projection it knows) gives ``attention_entropy`` rows with
value NaN and the reason in ``note``, never a made-up 0. A model without ``.blocks`` is a UserError.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from .rank_collapse import find_blocks, token_representations
from .metrics import attention_entropy, attention_probs, effective_rank, frob, representation_shift, token_similarity

TOKEN_METRICS = ("shift", "token_similarity", "effective_rank")
PID_TERMS = ("attn", "p", "i", "d")


def qkv_of(attn: nn.Module, x: torch.Tensor) -> Tuple[Optional[Tuple[torch.Tensor, ...]], str]:
    """((q, k, v) of shape (B, H, N, d) and the softmax scale, "") or (None, why not)."""
    if callable(getattr(attn, "project", None)) and hasattr(attn, "head_dim"):  # FAN token mixing family
        q, k, v = attn.project(x)
        return (q, k, v, float(attn.head_dim) ** -0.5), ""
    lin = getattr(attn, "qkv", None)
    heads, hd = getattr(attn, "num_heads", None), getattr(attn, "head_dim", None)
    if isinstance(lin, nn.Linear) and heads and hd:
        width = heads * hd
        B, N, _ = x.shape
        scale = float(getattr(attn, "scale", hd ** -0.5))
        k_norm = getattr(attn, "k_norm", nn.Identity())
        if lin.out_features == 3 * width:  # timm Attention (PID, RPC-Asym): q, k, v
            q, k, v = lin(x).reshape(B, N, 3, heads, hd).permute(2, 0, 3, 1, 4).unbind(0)
            return (getattr(attn, "q_norm", nn.Identity())(q), k_norm(k), v, scale), ""
        if lin.out_features == 2 * width:  # symmetric attention (SymViT, RPC): k, v; keys act as queries
            k, v = lin(x).reshape(B, N, 2, heads, hd).permute(2, 0, 3, 1, 4).unbind(0)
            k = k_norm(k)
            return (k, k, v, scale), ""
    return None, (f"{type(attn).__name__} exposes no q/k projection the probe can read "
                  f"(known: timm Attention's qkv, symmetric qkv, FAN's project())")


def pap_sparse(k: torch.Tensor, v: torch.Tensor, iterations: int, lam: float, convention: str,
               model_dim: int, q: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``symvit.pap_attention``'s iterations (dropout off), also returning the last sparse part S and the
    cleaned keys K' of the last step: (L_n, S_n, K'_n). A test checks L_n against ``pap_attention``."""
    n_tok, d = k.shape[-2], k.shape[-1]
    width = model_dim if convention == "authors" else d
    l1 = k.abs().sum(dim=(-2, -1), keepdim=True).clamp_min(torch.finfo(k.dtype).tiny)
    mu = n_tok * width / (4.0 * l1)
    tau = lam * mu if convention == "authors" else lam / mu
    low, y = torch.zeros_like(k), torch.zeros_like(k)
    s = kc = k
    for it in range(iterations):
        r = k - low + y / mu
        s = r.sign() * (r.abs() - tau).clamp_min(0)
        kc = k - s - y / mu
        low = F.scaled_dot_product_attention(kc if q is None else q, kc, v)
        if it < iterations - 1:
            y = y + mu * (k - low - s)
    return low, s, kc


def pid_terms(attn: nn.Module, state: Any, probs: torch.Tensor, v: torch.Tensor) -> Dict[str, torch.Tensor]:
    """The layer's four output terms and its error e^l, from the controller state *before* the layer
    updates it (the pre-hook runs first), as ``pid_vit.pid_control`` forms them (a test adds them up
    and gets the module's output)."""
    g = attn.gains
    ref = state.reference if state.reference is not None else g.beta * v
    e = ref - v
    e_sum = e if state.error_sum is None else state.error_sum + e
    if state.prev_error is not None:
        d_term = g.lambda_d * (e - state.prev_error)
    else:
        d_term = g.lambda_d * e if g.first_derivative == "zero-error" else torch.zeros_like(e)
    return {"attn": probs.to(v.dtype) @ v, "p": g.lambda_p * e, "i": g.lambda_i * e_sum, "d": d_term, "error": e}


def _pid_metrics(attn: nn.Module, state: Any, probs: torch.Tensor, v: torch.Tensor) -> Dict[str, torch.Tensor]:
    """||e^l|| and each term's share of the sum of the four terms' norms."""
    terms = pid_terms(attn, state, probs, v)
    norms = {t: frob(terms[t]) for t in PID_TERMS}
    total = sum(norms.values())
    out = {"pid_error_norm": frob(terms["error"])}
    for t in PID_TERMS:
        out[f"pid_share_{t}"] = norms[t] / total.clamp_min(torch.finfo(torch.float64).tiny)
    return out


def read_layer(attn: Optional[nn.Module], x: torch.Tensor, kwargs: Dict[str, Any]) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """(metric -> per-sample values, metric -> reason it is absent) of one block's attention on input x."""
    if attn is None:
        return {}, {"attention_entropy": "the block has no .attn module"}
    got, why = qkv_of(attn, x)
    if got is None:
        return {}, {"attention_entropy": why}
    q, k, v, scale = got
    out: Dict[str, torch.Tensor] = {}
    iters = int(getattr(attn, "pap_iterations", 0) or 0)
    if iters > 0:
        sym = q is k
        width = int(getattr(attn, "attn_dim", 0) or attn.num_heads * attn.head_dim)
        _, s, kc = pap_sparse(k, v, iters, float(attn.pap_lambda), str(attn.pap_convention), width,
                              q=None if sym else q)
        probs = attention_probs(kc if sym else q, kc, scale)  # the attention the last PAP step applies
        out["pap_sparse_norm"] = frob(s)
        out["pap_sparse_fraction"] = frob(s) / frob(k).clamp_min(torch.finfo(torch.float64).tiny)
    else:
        probs = attention_probs(q, k, scale)
    out["attention_entropy"] = attention_entropy(probs)
    state = kwargs.get("state")
    if getattr(attn, "gains", None) is not None and state is not None and hasattr(state, "prev_error"):
        out.update(_pid_metrics(attn, state, probs, v))
    return out, {}


@contextmanager
def _attention_hooks(model: nn.Module, store: Dict[int, Tuple[Dict[str, torch.Tensor], Dict[str, str]]]) -> Iterator[None]:
    handles = []
    for i, blk in enumerate(find_blocks(model), start=1):
        attn = getattr(blk, "attn", None)
        if not isinstance(attn, nn.Module):
            store[i] = read_layer(None, torch.empty(0), {})
            continue

        def pre(mod: nn.Module, args: tuple, kwargs: dict, i: int = i) -> None:
            x = args[0] if args else kwargs.get("x")
            store[i] = read_layer(mod, x, kwargs)

        handles.append(attn.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def layer_metrics(model: nn.Module, x: torch.Tensor, clean: Optional[Dict[int, torch.Tensor]] = None
                  ) -> Tuple[Dict[int, torch.Tensor], Dict[Tuple[int, str], torch.Tensor], Dict[Tuple[int, str], str]]:
    """One forward pass with hooks: (token representations per layer, (layer, metric) -> per-sample
    values, (layer, metric) -> reason absent). ``clean``: the clean input's representations for the
    shift (None: ``x`` is the clean input, shift 0 by definition, computed as shift(h, h))."""
    attn_store: Dict[int, Tuple[Dict[str, torch.Tensor], Dict[str, str]]] = {}
    with _attention_hooks(model, attn_store):
        _, reps = token_representations(model, x)
    values: Dict[Tuple[int, str], torch.Tensor] = {}
    absent: Dict[Tuple[int, str], str] = {}
    for layer, h in reps.items():
        values[(layer, "shift")] = representation_shift(h, h if clean is None else clean[layer])
        values[(layer, "token_similarity")] = token_similarity(h)
        values[(layer, "effective_rank")] = effective_rank(h)
    for layer, (vals, why) in sorted(attn_store.items()):
        values.update({(layer, m): v for m, v in vals.items()})
        absent.update({(layer, m): r for m, r in why.items()})
    return reps, values, absent


def rows(sample_ids: List[str], values: Dict[Tuple[int, str], torch.Tensor], absent: Dict[Tuple[int, str], str],
         moved: Optional[np.ndarray] = None) -> pd.DataFrame:
    """The tidy rows of one batch: sample_id, layer, metric, value, moved, note (one host copy)."""
    n = len(sample_ids)
    keys = list(values)
    mat = torch.stack([values[k].double().reshape(-1) for k in keys]).cpu().numpy() if keys else np.zeros((0, n))
    moved = np.ones(n, dtype=bool) if moved is None else np.asarray(moved, dtype=bool)
    parts = [pd.DataFrame({"sample_id": sample_ids, "layer": layer, "metric": metric, "value": mat[j],
                           "moved": moved, "note": ""}) for j, (layer, metric) in enumerate(keys)]
    parts += [pd.DataFrame({"sample_id": sample_ids, "layer": layer, "metric": metric, "value": np.nan,
                            "moved": moved, "note": why}) for (layer, metric), why in absent.items()]
    out = pd.concat(parts, ignore_index=True)
    return out.astype({"layer": "int64", "value": "float64"})
