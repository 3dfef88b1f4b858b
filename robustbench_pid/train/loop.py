"""Train an embedded digits model with its family's pinned, seeded recipe (CPU, minutes).

    robustbench-pid train --model deit                      # into ./trained/ (a folder of yours)
    robustbench-pid train --model pid_deit --adversarial    # PGD adversarial training: pid_deit_at
    robustbench-pid train --model deit_at --into-package    # replaces a shipped model: explicit only

The recipes live in ``recipes.py`` (one per family; both sides of a claim train identically).

Writes ``<out>/<name>-<sha256 prefix>.safetensors`` (the bare network's state dict, timm key names) and
a manifest entry: architecture and arguments, dataset and split, recipe (with its adversarial-training
block), clean test top-1, sha256, library versions; both in one transaction (``hub/checkpoints.py``).
The package's own folder, whose files are the project's ground truth, is written only when asked by
name (``into_package``); by default training goes to ``./trained``.

Bit-for-bit reproducible: the recipe fixes everything the weights depend on besides the library
versions: the seed (initialization, shuffling and augmentation draw from seeded generators), the
number of CPU threads (a float sum over 1 or 2 threads rounds differently, and 80 epochs turn
that into another checkpoint) and deterministic kernels. The same recipe on the same versions
gives the same sha256; the manifest records all of it.
"""
from __future__ import annotations

import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

from ..errors import UserError
from ..hub.checkpoints import checkpoints_dir, commit_checkpoint
from .recipes import Recipe, alias_recipe, base_model, embedded_name, family_of, trainable

DEFAULT_OUT = Path("trained")  # relative to the working folder, as evaluate's results/

if TYPE_CHECKING:
    import torch


def _shift(x: torch.Tensor, max_shift: int, gen: torch.Generator) -> torch.Tensor:
    import torch
    import torch.nn.functional as F

    if max_shift <= 0:
        return x
    pad = F.pad(x, (max_shift,) * 4)
    n, _, h, w = x.shape
    dx = torch.randint(0, 2 * max_shift + 1, (n,), generator=gen)
    dy = torch.randint(0, 2 * max_shift + 1, (n,), generator=gen)
    return torch.stack([pad[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(n)])


def output_folder(out_dir: Optional[Union[str, Path]], into_package: bool) -> Path:
    """Where a training run writes: ``out_dir`` (default ``./trained``), or the package's checkpoints folder
    when ``into_package``; the package folder under another name is refused (it is the project's ground truth)."""
    shipped = checkpoints_dir()
    if into_package:
        if out_dir is not None:
            raise UserError("--into-package writes the package's own checkpoints folder; drop --out (or drop "
                            "--into-package to train into a folder of yours)")
        return shipped
    if out_dir is not None and str(out_dir).strip() == "":
        raise UserError("--out '' names no folder; pass a folder for the checkpoint (default: ./trained)")
    folder = Path(out_dir) if out_dir is not None else DEFAULT_OUT
    if folder.resolve() == shipped.resolve():
        raise UserError(f"--out {folder} is the package's shipped checkpoints folder, whose files are the project's "
                        f"ground truth; to replace a shipped model pass --into-package instead of --out, otherwise "
                        f"pick a folder of yours (default: ./trained)")
    return folder


def train(model: str, recipe: Optional[Recipe] = None, out_dir: Optional[Union[str, Path]] = None,
          log: Any = print, limit: Optional[int] = None, into_package: bool = False) -> Dict[str, Any]:
    """Train ``model`` (default: its pinned recipe) and record it in ``out_dir``'s manifest (default
    ``./trained``; the package's own folder only with ``into_package``).

    ``model`` is a family member (``deit``) or one trained adversarially (``pid_deit_at``, ``fan_at``: the
    base's recipe plus PGD adversarial training). ``limit`` trains on the first N training digits only (smoke
    tests); the manifest says so.
    """
    import torch

    base_model(model)  # refuses a model without a recipe before touching torch settings
    recipe = recipe or alias_recipe(model)
    if limit is not None and limit < 1:
        raise UserError(f"--limit {limit}: train on at least 1 image")
    out = output_folder(out_dir, into_package)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a folder; pass a folder (it is created if missing)")

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(recipe.threads)
    torch.use_deterministic_algorithms(True)
    try:
        return _train(model, recipe, out, log, limit)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def fit(net: "torch.nn.Module", recipe: Recipe, train_ds: Any, test_ds: Any, tag: str, log: Any,
        limit: Optional[int] = None) -> float:
    """Train ``net`` (a timm-style network taking normalized images, ``net.pretrained_cfg`` naming the
    normalisation) in place with ``recipe`` on the digits' train split (its first ``limit`` images); returns the
    clean top-1 on ``test_ds``. The caller seeds torch and fixes threads and kernels (:func:`train`,
    ``scripts/held_out.py``)."""
    import torch

    from ..models.wrapper import Normalized
    from .objectives import FreeDelta, batch_loss

    cfg = net.pretrained_cfg
    mean = torch.tensor(cfg["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(cfg["std"]).view(1, -1, 1, 1)
    pixels = Normalized(net, cfg["mean"], cfg["std"])
    x_train, y_train = train_ds.images[:limit], train_ds.labels[:limit]
    gen = torch.Generator().manual_seed(recipe.seed)
    opt = torch.optim.AdamW(net.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    adv = recipe.adversarial
    replays = adv.replays if adv is not None else 1  # free AT: an optimiser step per replay of a batch
    free = FreeDelta() if adv is not None and adv.method == "free" else None
    steps_per_epoch = (len(y_train) + recipe.batch_size - 1) // recipe.batch_size
    total = recipe.epochs * steps_per_epoch * replays
    warm = recipe.warmup_epochs * steps_per_epoch * replays
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + torch.cos(torch.tensor((s - warm) / max(1, total - warm) * torch.pi)).item())
    )
    t0 = time.time()
    history: List[float] = []
    for epoch in range(recipe.epochs):
        net.train()
        perm = torch.randperm(len(y_train), generator=gen)
        total_loss = 0.0
        for s in range(steps_per_epoch):
            idx = perm[s * recipe.batch_size:(s + 1) * recipe.batch_size]
            xb = _shift(x_train[idx], recipe.max_shift, gen)
            for _ in range(replays):
                loss = batch_loss(net, pixels, xb, y_train[idx], adv, epoch, gen, recipe.label_smoothing, free)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                if free is not None:
                    free.step(adv, adv.eps_at(epoch))
                total_loss += loss.item() * len(idx) / replays
        history.append(total_loss / len(y_train))
        spent = time.time() - t0  # every epoch: a person waits on each, and the ETA comes from their own rate
        log(f"[{tag}] epoch {epoch + 1}/{recipe.epochs} loss {history[-1]:.4f} ({spent:.0f}s, about "
            f"{spent / (epoch + 1) * (recipe.epochs - epoch - 1):.0f}s left)")
    net.eval()
    with torch.inference_mode():
        pred = net((test_ds.images - mean) / std).argmax(1)
    top1 = (pred == test_ds.labels).float().mean().item()
    log(f"[{tag}] clean test top-1 {100 * top1:.2f}% on {len(test_ds)} images")
    return top1


def _train(model: str, recipe: Recipe, out_dir: Path, log: Any, limit: Optional[int]) -> Dict[str, Any]:
    import torch

    from ..core.version import __version__
    from ..data import load_dataset
    from ..models.zoo import build_model, resolve_model, robustness_settings

    torch.manual_seed(recipe.seed)
    res = resolve_model(base_model(model), "digits")
    name = embedded_name(model)
    net = build_model(res.arch, num_classes=10, **res.arch_kwargs)
    cfg = net.pretrained_cfg
    train_ds = load_dataset("digits", "train", model_info={"input_size": cfg["input_size"]})
    test_ds = load_dataset("digits", "test", model_info={"input_size": cfg["input_size"]})
    t0 = time.time()
    top1 = fit(net, recipe, train_ds, test_ds, model, log, limit)
    x_train = train_ds.images[:limit]

    from safetensors.torch import save_file
    import sklearn
    import timm

    entry = {
        "model": model,
        "arch": res.arch,
        "arch_kwargs": {**res.arch_kwargs, **robustness_settings(net)},
        "dataset": "digits",
        "split": train_ds.provenance | {"n_train": len(x_train), "n_test": len(test_ds)},
        "family": family_of(model if model in trainable() else base_model(model)),
        "recipe": recipe.as_dict(),
        "recipe_is_pinned": recipe == alias_recipe(model) and limit is None,
        "clean_test_top1": round(top1, 6),
        "train_seconds": round(time.time() - t0, 1),
        "reproduces_with": {"threads": recipe.threads, "deterministic_algorithms": True, "device": "cpu"},
        "versions": {"robustbench_pid": __version__, "torch": torch.__version__, "timm": timm.__version__,
                     "scikit-learn": sklearn.__version__, "python": platform.python_version()},
    }
    state = {k: v.contiguous() for k, v in net.state_dict().items()}
    entry = commit_checkpoint(out_dir, name, lambda p: save_file(state, str(p)), entry)
    log(f"[{model}] wrote {out_dir / entry['file']} (manifest: {out_dir / 'manifest.json'})")
    return entry

