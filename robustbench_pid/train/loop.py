"""Train an embedded digits model with its family's pinned, seeded recipe (CPU, minutes).

    robustbench-pid train --model deit
    robustbench-pid train --model rpc_symvit_all

The recipes live in ``recipes.py`` (one per family; both sides of a claim train identically).

Writes ``checkpoints/<name>.safetensors`` (the bare network's state dict, timm key names) and a
manifest entry: architecture and arguments, dataset and split, recipe, clean test top-1, sha256,
library versions.

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
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from ..hub.checkpoints import checkpoints_dir, write_manifest_entry
from .recipes import Recipe, embedded_name, family_of, recipe_for

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


def train(model: str, recipe: Optional[Recipe] = None, out_dir: Optional[Path] = None,
          log: Any = print, limit: Optional[int] = None) -> Dict[str, Any]:
    """Train ``model`` (default: its family's pinned recipe) and record it in ``out_dir``'s manifest.

    ``limit`` trains on the first N training digits only (smoke tests); the manifest says so.
    """
    import torch

    family_of(model)  # refuses a model without a recipe before touching torch settings
    recipe = recipe or recipe_for(model)
    if limit is not None and limit < 1:
        from ..errors import UserError
        raise UserError(f"--limit {limit}: train on at least 1 image")

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(recipe.threads)
    torch.use_deterministic_algorithms(True)
    try:
        return _train(model, recipe, out_dir, log, limit)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def _train(model: str, recipe: Recipe, out_dir: Optional[Path], log: Any, limit: Optional[int]) -> Dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from ..core.version import __version__
    from ..data import load_dataset
    from ..loaders import sha256_file
    from ..models.zoo import build_model, resolve_model, robustness_settings

    torch.manual_seed(recipe.seed)
    res = resolve_model(model, "digits")
    name = embedded_name(model)
    assert res.checkpoint == f"embedded:{name}", (model, res.checkpoint)  # the zoo loads what train writes
    net = build_model(res.arch, num_classes=10, **res.arch_kwargs)
    cfg = net.pretrained_cfg
    mean = torch.tensor(cfg["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(cfg["std"]).view(1, -1, 1, 1)
    train_ds = load_dataset("digits", "train", model_info={"input_size": cfg["input_size"]})
    test_ds = load_dataset("digits", "test", model_info={"input_size": cfg["input_size"]})
    x_train, y_train = train_ds.images[:limit], train_ds.labels[:limit]
    gen = torch.Generator().manual_seed(recipe.seed)
    opt = torch.optim.AdamW(net.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    steps_per_epoch = (len(y_train) + recipe.batch_size - 1) // recipe.batch_size
    total = recipe.epochs * steps_per_epoch
    warm = recipe.warmup_epochs * steps_per_epoch
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
            loss = F.cross_entropy(net((xb - mean) / std), y_train[idx], label_smoothing=recipe.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total_loss += loss.item() * len(idx)
        history.append(total_loss / len(y_train))
        if (epoch + 1) % 10 == 0 or epoch == recipe.epochs - 1:
            log(f"[{model}] epoch {epoch + 1}/{recipe.epochs} loss {history[-1]:.4f} ({time.time() - t0:.0f}s)")
    net.eval()
    with torch.inference_mode():
        pred = net((test_ds.images - mean) / std).argmax(1)
    top1 = (pred == test_ds.labels).float().mean().item()
    log(f"[{model}] clean test top-1 {100 * top1:.2f}% on {len(test_ds)} images")

    out_dir = Path(out_dir or checkpoints_dir())
    out_dir.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    path = out_dir / f"{name}.safetensors"
    tmp = path.with_suffix(".safetensors.tmp")
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(tmp))
    tmp.chmod(0o644)  # safetensors writes owner-only; the file ships to every user
    tmp.replace(path)
    import sklearn
    import timm

    entry = {
        "file": path.name,
        "sha256": sha256_file(path),
        "model": model,
        "arch": res.arch,
        "arch_kwargs": {**res.arch_kwargs, **robustness_settings(net)},
        "dataset": "digits",
        "split": train_ds.provenance | {"n_train": len(y_train), "n_test": len(test_ds)},
        "family": family_of(model),
        "recipe": asdict(recipe),
        "recipe_is_pinned": recipe == recipe_for(model) and limit is None,
        "clean_test_top1": round(top1, 6),
        "train_seconds": round(time.time() - t0, 1),
        "reproduces_with": {"threads": recipe.threads, "deterministic_algorithms": True, "device": "cpu"},
        "versions": {"robustbench_pid": __version__, "torch": torch.__version__, "timm": timm.__version__,
                     "scikit-learn": sklearn.__version__, "python": platform.python_version()},
    }
    write_manifest_entry(name, entry, out_dir)
    return entry

