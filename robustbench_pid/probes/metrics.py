"""The attention probe's metrics as small pure functions on tensors (tested against hand values).

Every function takes a batch and returns one float64 value per sample (shape ``(B,)``); the
token-similarity metric is PIDformer A.6's, reused from ``robustbench_pid.probes.rank_collapse``.

- ``representation_shift(h_adv, h)``: ||h_adv - h||_F / ||h||_F over the sample's whole token matrix
  (N x D). 0 when the inputs agree; > the layer-0 value means the block stack amplified the
  perturbation, < means it damped it (PIDformer: the softmax steady state is input-sensitive).
- ``effective_rank(tokens)``: Roy & Vetterli's effective rank exp(H(p)), p_i = s_i / sum_j s_j over the
  singular values s of the (uncentred) N x D token matrix, H the Shannon entropy in nats. A rank-1
  matrix gives 1, an orthogonal N x N matrix gives N; a zero matrix is undefined (NaN).
- ``attention_entropy(probs)``: -sum_j p_ij log p_ij per query, averaged over heads and queries (nats);
  uniform attention over N keys gives log N, one-hot attention 0.
- ``token_similarity``: the average pairwise cosine of the tokens (``analysis.pairwise_cosine``).
"""
from __future__ import annotations

import torch

from .rank_collapse import pairwise_cosine

__all__ = ["representation_shift", "effective_rank", "attention_entropy", "token_similarity", "attention_probs",
           "frob"]


def frob(t: torch.Tensor) -> torch.Tensor:
    """Frobenius norm per sample (over every axis but the first), float64."""
    return t.double().flatten(1).norm(dim=1)


def representation_shift(h_adv: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """||h_adv - h||_F / ||h||_F per sample; NaN where ||h|| = 0 (no scale to compare with)."""
    if h_adv.shape != h.shape:
        raise ValueError(f"shift needs equal shapes, got {tuple(h_adv.shape)} and {tuple(h.shape)}")
    den = frob(h)
    num = frob(h_adv.double() - h.double())
    return torch.where(den > 0, num / den.clamp_min(torch.finfo(torch.float64).tiny), torch.full_like(den, float("nan")))


def effective_rank(tokens: torch.Tensor) -> torch.Tensor:
    """exp(entropy of the normalised singular values) of each (N, D) matrix in a (B, N, D) batch."""
    s = torch.linalg.svdvals(tokens.double())
    total = s.sum(-1, keepdim=True)
    p = s / total.clamp_min(torch.finfo(torch.float64).tiny)
    h = -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(-1)
    return torch.where(total.squeeze(-1) > 0, h.exp(), torch.full_like(h, float("nan")))


def attention_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Mean over heads and queries of the entropy (nats) of each attention row: (B, H, N, M) -> (B,)."""
    p = probs.double()
    h = -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(-1)
    return h.flatten(1).mean(1)


def token_similarity(tokens: torch.Tensor) -> torch.Tensor:
    """PIDformer A.6: average cosine over ordered pairs of distinct tokens, per sample."""
    return pairwise_cosine(tokens.float())


def attention_probs(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) over the keys, computed in float32 (what fused SDPA computes, written out)."""
    return ((q.float() @ k.float().transpose(-2, -1)) * scale).softmax(dim=-1)
