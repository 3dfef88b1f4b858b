"""``robustbench-pid train``: train the embedded digits checkpoints."""
from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

NAME = "train"
HELP = "train the embedded digits deit / pid_deit with one seeded recipe and update the embedded checkpoints manifest (checkpoints/)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train import Recipe

    p.add_argument("--model", required=True, choices=["deit", "pid_deit"])
    p.add_argument("--out", type=Path, default=None, help="folder for the checkpoint (default: checkpoints/)")
    for f, v in asdict(Recipe()).items():
        p.add_argument(f"--{f.replace('_', '-')}", type=type(v), default=v)


def run(a: argparse.Namespace) -> int:
    from ..train import Recipe, train

    recipe = Recipe(**{f: getattr(a, f) for f in asdict(Recipe())})
    train(a.model, recipe, a.out)
    return 0
