"""``rank-collapse``: average pairwise cosine similarity of token representations, per layer
(PIDformer Fig. 2 / appendix A.6; the metric is ``robustbench_pid.probes.rank_collapse.pairwise_cosine``).

Images: on ImageNet-family datasets a seeded random choice of 1000 test images (the paper's
count; ``--seed`` picks them), on the embedded digits set all 360. ``--limit N`` / ``--subset N``
choose the images yourself (then all of them are used); the Python option
``benchmark_options={"rank_collapse": {"n_images": N}}`` sets the random count.

Records: one row per (image, layer): the usual identity columns with ``attack`` = ``clean``,
``eps`` = 0, plus ``layer`` (0 = patch + position embeddings, l = output of block l), ``metric``
= ``token_cosine`` and ``value`` (the image's average cosine, in [-1, 1]); ``clean_pred`` /
``clean_correct_top1/5`` are kept so the analysis can be split by correctness.
Tidy rows: one per layer: ``metric`` = ``token_cosine``, ``value`` = mean over images (a cosine,
not a percentage), ``n`` images, ``ci_low``/``ci_high`` = 95% normal interval of the mean,
``layer`` (int) and ``condition`` = ``layer=LL`` (zero-padded, so text sorts by depth).
"""
from __future__ import annotations

import json
from typing import Any, Dict, List

import pandas as pd
import torch

from ..attacks.base import still_correct
from ..runtime.health import check_finite
from ..specs import Unit, chunks
from . import Batch, Benchmark, benchmarks

NAME = "rank-collapse"
DEFAULT_IMAGES = {"imagenet": 1000}  # PIDformer A.6: "1000 randomly chosen test data in ImageNet"


def _options(ctx: Any) -> Dict[str, Any]:
    opts = dict(ctx.spec.benchmark_options.get("rank_collapse", {}))
    if "n_images" in ctx.spec.benchmark_options:
        opts.setdefault("n_images", ctx.spec.benchmark_options["n_images"])
    return opts


def select_images(ctx: Any) -> str:
    """Narrow ``ctx.indices`` to the images to analyse; returns how they were chosen (recorded)."""
    from ..data import dataset_info
    from ..errors import UserError

    n_images = _options(ctx).get("n_images")
    user_chose = ctx.spec.limit is not None or ctx.spec.subset is not None
    if n_images is None and not user_chose:
        n_images = DEFAULT_IMAGES.get(dataset_info(ctx.spec.dataset).family)
    if n_images is not None:
        n_images = int(n_images)
        if n_images < 1:
            raise UserError(f"rank-collapse: n_images must be >= 1, got {n_images}")
        if n_images < len(ctx.indices):
            g = torch.Generator().manual_seed(int(ctx.spec.seed))
            pos = torch.randperm(len(ctx.indices), generator=g)[:n_images].sort().values.tolist()
            ctx.indices = [ctx.indices[i] for i in pos]
            return f"random {n_images} of the evaluated set (seed {ctx.spec.seed})"
    return "all of the evaluated set"


@benchmarks.register(NAME)
class RankCollapse(Benchmark):
    name = NAME
    samples = ("labelled", "restricted")  # clean images: one per sample, whatever class set scores them
    group_cols = ["layer"]
    options = {"n_images": "how many images to choose at random (seeded by --seed)"}
    option_kinds = {"n_images": "count"}

    def plan(self, ctx: Any) -> List[Unit]:
        selection = select_images(ctx)
        params = json.dumps({"metric": "token_cosine", "representation": "block_output", "tokens": "all",
                             "selection": selection, "n_images": len(ctx.indices)}, sort_keys=True)
        return [Unit(NAME, "clean", 0.0, params, "", s, e) for s, e in chunks(len(ctx.indices), ctx.spec.chunk_size)]

    def records(self, ctx: Any, unit: Unit, b: Batch) -> pd.DataFrame:
        """One row per (image, layer), layer by layer."""
        from ..probes.rank_collapse import layer_cosines

        # not the compiled copy: the forward hooks live on the eager modules
        logits, cos = layer_cosines(ctx.model, b.x)
        logits = logits.float()
        check_finite(logits, ctx, unit, "clean")
        pred = logits.argmax(1)
        c1 = (pred == b.y).cpu().numpy()
        c5 = still_correct(logits, b.y, 5).cpu().numpy()
        cos, label, pred = cos.cpu(), b.y.cpu().numpy(), pred.cpu().numpy()
        return pd.concat([pd.DataFrame({
            "sample_id": b.sample_ids, "label": label, "clean_pred": pred, "clean_correct_top1": c1,
            "clean_correct_top5": c5, "layer": layer, "metric": "token_cosine",
            "value": cos[layer].numpy().astype("float64")}) for layer in range(cos.shape[0])], ignore_index=True)


