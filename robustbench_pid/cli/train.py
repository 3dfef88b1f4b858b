"""``robustbench-pid train``: train an embedded digits checkpoint with its family's pinned recipe."""
from __future__ import annotations

import argparse
from dataclasses import asdict, fields
from pathlib import Path

NAME = "train"
HELP = ("train an embedded digits model (every zoo alias) with its family's pinned, seeded recipe and record it in "
        "the embedded checkpoints manifest (checkpoints/)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train import Recipe, trainable

    p.add_argument("--model", required=True, choices=list(trainable()))
    p.add_argument("--out", type=Path, default=None, help="folder for the checkpoint (default: checkpoints/)")
    p.add_argument("--limit", type=int, default=None,
                   help="train on the first N training digits only (a smoke test; the manifest records n_train)")
    for f in fields(Recipe):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=None,
                       help=f"override the family recipe's {f.name} (the manifest records the recipe used)")


def run(a: argparse.Namespace) -> int:
    from ..train import Recipe, recipe_for, train

    pinned = asdict(recipe_for(a.model))
    overrides = {f: getattr(a, f) for f in pinned if getattr(a, f) is not None}
    train(a.model, Recipe(**{**pinned, **overrides}), a.out, limit=a.limit)
    return 0
