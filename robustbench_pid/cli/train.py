"""``robustbench-pid train``: train a digits model with its family's pinned, seeded recipe."""
from __future__ import annotations

import argparse
import math
from dataclasses import asdict, fields

NAME = "train"
HELP = ("train a digits model (every zoo alias; --adversarial: PGD adversarial training) with its family's pinned, "
        "seeded recipe into a folder of yours (default ./trained) with its manifest entry")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train import Recipe, trainable
    from ..train.recipes import Adversarial, adversarial_fields, recipe_fields

    p.add_argument("--model", required=True, choices=list(trainable()))
    p.add_argument("--adversarial", action="store_true",
                   help="PGD adversarial training (the family recipe plus the adversarial block: eps 8/255, 7 steps "
                        "of 2/255, eps ramped over 10 epochs); trains MODEL_at (deit_at and pid_deit_at are zoo "
                        "members already trained this way)")
    p.add_argument("--out", default=None,  # a string: argparse's Path('') would be the current folder
                   help="folder for the checkpoint and its manifest.json (default: ./trained)")
    p.add_argument("--into-package", action="store_true",
                   help="write into the package's own checkpoints folder, replacing the shipped model of that name "
                        "(its old file is kept until the new file and manifest entry are both in place)")
    p.add_argument("--limit", type=int, default=None,
                   help="train on the first N training digits only (a smoke test; the manifest records n_train)")
    defaults = {f.name: f.default for f in fields(Recipe)}
    for name in recipe_fields():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(defaults[name]), default=None,
                       help=f"override the family recipe's {name} (the manifest records the recipe used)")
    for f in fields(Adversarial):
        if f.name in adversarial_fields():
            p.add_argument(f"--adv-{f.name.replace('_', '-')}", type=type(f.default), default=None,
                           help=f"adversarial training's {f.name} (default {f.default:g}; with --adversarial or an "
                                f"_at model)")


def run(a: argparse.Namespace) -> int:
    from dataclasses import replace

    from ..errors import UserError
    from ..train import Recipe, train
    from ..train.recipes import adversarial_fields, alias_recipe, recipe_fields, trained_alias

    model = trained_alias(a.model, a.adversarial)
    pinned = alias_recipe(model)
    overrides = {f: getattr(a, f) for f in recipe_fields() if getattr(a, f) is not None}
    adv = {f: getattr(a, f"adv_{f}") for f in adversarial_fields() if getattr(a, f"adv_{f}") is not None}
    for k, v in {**overrides, **adv}.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise UserError(f"--{('adv-' if k in adv else '') + k.replace('_', '-')} {v}: must be a finite number")
    if adv and pinned.adversarial is None:
        raise UserError(f"--adv-* options set adversarial training; add --adversarial (or train {a.model}_at)")
    recipe = Recipe(**{**asdict(pinned), **overrides, "adversarial": None})
    if pinned.adversarial is not None:
        recipe = replace(recipe, adversarial=replace(pinned.adversarial, **adv))
    recipe = _scaled_warmup(recipe, pinned, overrides)
    train(model, recipe, a.out, limit=a.limit, into_package=a.into_package)
    return 0


def _scaled_warmup(recipe, pinned, overrides):
    """``--epochs`` at or below the recipe's warm-up would spend the whole run warming up (the learning rate never
    decays): the warm-up keeps the pinned recipe's share of the epochs instead, and says so. ``--warmup-epochs``
    given explicitly is kept as it is."""
    import sys
    from dataclasses import replace

    if "warmup_epochs" in overrides or recipe.warmup_epochs < recipe.epochs:
        return recipe
    warm = int(recipe.epochs * pinned.warmup_epochs / pinned.epochs)
    print(f"note: --epochs {recipe.epochs} is not longer than the recipe's warmup_epochs {recipe.warmup_epochs}, so "
          f"the learning rate would never decay; warming up for {warm} epoch(s) instead (the recipe's "
          f"{pinned.warmup_epochs} of {pinned.epochs}, scaled; pass --warmup-epochs N to choose)", file=sys.stderr)
    return replace(recipe, warmup_epochs=warm)
