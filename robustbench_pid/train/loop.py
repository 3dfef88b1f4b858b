"""Train the embedded digits models with one identical, seeded recipe (CPU, minutes).

    robustbench-pid train --model deit
    robustbench-pid train --model pid_deit

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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from .checkpoints import checkpoints_dir, write_manifest_entry

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Recipe:
    epochs: int = 80
    batch_size: int = 64
    lr: float = 2e-3
    weight_decay: float = 0.05
    warmup_epochs: int = 5
    label_smoothing: float = 0.1
    max_shift: int = 2  # random translation by up to this many pixels (zero padding)
    seed: int = 0
    threads: int = 2  # CPU threads for training: part of the result (see the module docstring)


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


def train(model: str, recipe: Recipe = Recipe(), out_dir: Optional[Path] = None,
          log: Any = print) -> Dict[str, Any]:
    import torch

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(recipe.threads)
    torch.use_deterministic_algorithms(True)
    try:
        return _train(model, recipe, out_dir, log)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def _train(model: str, recipe: Recipe, out_dir: Optional[Path], log: Any) -> Dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from .version import __version__
    from .data import load_dataset
    from .loaders import sha256_file
    from .models.zoo import build_model, resolve_model

    torch.manual_seed(recipe.seed)
    res = resolve_model(model, "digits")
    if not res.checkpoint or not res.checkpoint.startswith("embedded:"):
        raise ValueError(f"{model!r} has no embedded digits checkpoint to train")
    name = res.checkpoint.split(":", 1)[1]
    net = build_model(res.arch, num_classes=10, **res.arch_kwargs)
    cfg = net.pretrained_cfg
    mean = torch.tensor(cfg["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(cfg["std"]).view(1, -1, 1, 1)
    train_ds = load_dataset("digits", "train", model_info={"input_size": cfg["input_size"]})
    test_ds = load_dataset("digits", "test", model_info={"input_size": cfg["input_size"]})
    x_train, y_train = train_ds.images, train_ds.labels
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
    tmp.replace(path)
    import sklearn
    import timm

    gains = getattr(net, "gains", None)
    entry = {
        "file": path.name,
        "sha256": sha256_file(path),
        "model": model,
        "arch": res.arch,
        "arch_kwargs": {**res.arch_kwargs, **({"pid": gains.as_dict()} if gains is not None else {})},
        "dataset": "digits",
        "split": train_ds.provenance | {"n_train": len(train_ds), "n_test": len(test_ds)},
        "recipe": asdict(recipe),
        "clean_test_top1": round(top1, 6),
        "train_seconds": round(time.time() - t0, 1),
        "reproduces_with": {"threads": recipe.threads, "deterministic_algorithms": True, "device": "cpu"},
        "versions": {"robustbench_pid": __version__, "torch": torch.__version__, "timm": timm.__version__,
                     "scikit-learn": sklearn.__version__, "python": platform.python_version()},
    }
    write_manifest_entry(name, entry, out_dir)
    return entry

