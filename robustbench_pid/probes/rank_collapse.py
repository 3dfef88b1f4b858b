"""Rank-collapse analysis (PIDformer Fig. 2, appendix A.6): how similar tokens become with depth.

For one image with token representations x_1..x_N (N includes the class token) the metric is the
average pairwise cosine similarity

    c = 1/(N(N-1)) * sum_{i != j} cos(x_i, x_j),

computed exactly in O(N D) as (||sum_i u_i||^2 - N) / (N(N-1)) with u_i = x_i / ||x_i|| (the
diagonal terms are the N ones removed). A token of zero norm counts as orthogonal to every other.

Token representations are the outputs of the transformer blocks (the residual stream after block
l, before the final norm), taken with forward hooks on ``net.blocks[i]``, so any timm ViT-like model
works without special support (PID DeiT included, whose blocks take an extra state argument).
Layer 0 is the input of the first block (patch + position embeddings).

Plot several runs on one figure: ``python -m robustbench_pid.probes.rank_collapse plot RUN_DIR... -o fig.png``.
"""
from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pandas as pd
import torch
from torch import nn

from ..errors import UserError


def find_blocks(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks of a (possibly ``Normalized``-wrapped) timm model."""
    net = getattr(model, "net", model)
    blocks = getattr(net, "blocks", None)
    if blocks is None or len(blocks) == 0:
        raise UserError(f"{type(net).__name__} has no `.blocks` (a timm ViT-style model is needed for the "
                        f"rank-collapse analysis)")
    return blocks


@contextmanager
def _hooks(model: nn.Module, store: Dict[int, torch.Tensor]) -> Iterator[None]:
    blocks = find_blocks(model)
    handles = []

    def first_input(_mod: nn.Module, args: tuple, kwargs: dict) -> None:
        x = args[0] if args else kwargs.get("x")
        store[0] = x.detach()

    def keep(i: int):
        def hook(_mod: nn.Module, _inp: tuple, out: torch.Tensor) -> None:
            out = out[0] if isinstance(out, (tuple, list)) else out
            store[i] = out.detach()

        return hook

    handles.append(blocks[0].register_forward_pre_hook(first_input, with_kwargs=True))
    for i, blk in enumerate(blocks, start=1):
        handles.append(blk.register_forward_hook(keep(i)))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def token_representations(model: nn.Module, x: torch.Tensor) -> tuple:
    """(logits, {layer: tokens (B, N, D)}): layer 0 = block input, layer l = output of block l."""
    store: Dict[int, torch.Tensor] = {}
    with _hooks(model, store):
        logits = model(x)
    if len(store) != len(find_blocks(model)) + 1:
        raise RuntimeError("the model's forward did not run every block once (hooks saw "
                           f"{sorted(store)}); token representations are undefined")
    return logits, store


def pairwise_cosine(tokens: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Average cosine similarity over ordered pairs i != j, per sequence: (..., N, D) -> (...)."""
    n = tokens.shape[-2]
    if n < 2:
        raise ValueError("pairwise cosine similarity needs at least two tokens")
    t = tokens.double()
    norms = t.norm(dim=-1, keepdim=True)
    u = torch.where(norms > eps, t / norms.clamp_min(eps), torch.zeros_like(t))
    diag = (norms.squeeze(-1) > eps).sum(-1).to(t.dtype)  # cos(x_i, x_i) = 1 for every nonzero token
    total = u.sum(dim=-2).pow(2).sum(-1)
    return (total - diag) / (n * (n - 1))  # float64: the sums of many cosines stay exact enough


def layer_cosines(model: nn.Module, x: torch.Tensor) -> tuple:
    """(logits, tensor (L+1, B)): the per-image metric at every layer."""
    logits, reps = token_representations(model, x)
    return logits, torch.stack([pairwise_cosine(reps[i].float()) for i in range(len(reps))])


def main(argv: Optional[List[str]] = None) -> int:
    from ..results.report.plots import draw_rank_collapse
    from ..results.store import load_results

    p = argparse.ArgumentParser(prog="python -m robustbench_pid.probes.rank_collapse",
                                description="plot rank-collapse results of several runs on one figure")
    sub = p.add_subparsers(dest="cmd", required=True)
    pl = sub.add_parser("plot", help="token cosine similarity against depth, one line per run")
    pl.add_argument("runs", nargs="+", help="run folders (or folders holding several runs)")
    pl.add_argument("-o", "--out", type=Path, default=Path("rank_collapse.png"))
    pl.add_argument("--title")
    args = p.parse_args(argv)
    try:
        frames = [load_results(r) for r in args.runs]
        df = pd.concat(frames, ignore_index=True)
        out = draw_rank_collapse(df, args.out, args.title)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
