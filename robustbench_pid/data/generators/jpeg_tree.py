"""A generated ImageNet-validation tree of photo-like JPEGs, and the data path's decode rate on it.

No ImageNet is needed to measure what decoding costs: ``build_tree`` writes
``root/<wnid>/ILSVRC2012_val_XXXXXXXX.JPEG`` (real wnids, typical validation sizes, quality 90,
~75 KB a file), the layout ``--dataset imagenet`` reads; ``decode_rate`` reads it through the
project's own dataset and transform with a DataLoader of N workers (what ``--workers N`` runs).
Shared by ``scripts/bench_e2e.py`` and ``robustbench-pid doctor``.
"""
from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any, Dict, Sequence

# (width, height) of typical ImageNet validation images, and how often each occurs here
SIZES = ((500, 375), (500, 375), (500, 333), (375, 500), (333, 500), (500, 400))
MODEL_INFO_224 = {"input_size": (3, 224, 224), "interpolation": "bicubic", "crop_pct": 0.875}  # DeiT's


def make_image(rng: Any, w: int, h: int) -> Any:
    """A photo-like image: a smooth colour field blended with a mid-frequency texture, a few shapes,
    sensor-like noise (JPEGs of ~80 KB at 500x375, decoding like photos, not like flat or pure-noise
    images; real ImageNet validation files average ~130 KB)."""
    import numpy as np
    from PIL import Image, ImageDraw

    low = rng.integers(0, 256, (rng.integers(3, 8), rng.integers(3, 8), 3), dtype=np.uint8)
    img = Image.fromarray(low).resize((w, h), Image.BICUBIC)
    texture = rng.integers(0, 256, (h // 8, w // 8, 3), dtype=np.uint8)
    img = Image.blend(img, Image.fromarray(texture).resize((w, h), Image.BICUBIC), 0.35)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 12))):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1, y1 = x0 + int(rng.integers(10, w // 2)), y0 + int(rng.integers(10, h // 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=colour)
    arr = np.asarray(img, dtype=np.int16) + rng.normal(0, 12, (h, w, 3)).astype(np.int16)
    return Image.fromarray(arr.clip(0, 255).astype(np.uint8))


def _write_images(root: str, wnids: Sequence[str], seed: int, start: int, stop: int) -> None:
    import numpy as np

    for i in range(start, stop):
        rng = np.random.default_rng([seed, i])  # per image: the tree does not depend on the process count
        w, h = SIZES[i % len(SIZES)]
        folder = Path(root) / wnids[(i * 397) % len(wnids)]  # 397 is prime: the classes spread over all 1000
        folder.mkdir(parents=True, exist_ok=True)
        make_image(rng, w, h).save(folder / f"ILSVRC2012_val_{i + 1:08d}.JPEG", quality=90)


def build_tree(root: Path, n: int, seed: int = 0) -> None:
    """``root/<wnid>/ILSVRC2012_val_XXXXXXXX.JPEG``: the layout ``--dataset imagenet`` reads
    (~25 ms an image per core; in processes from 200 images on)."""
    from ...core.imagenet_info import imagenet_wnids

    wnids = list(imagenet_wnids())
    procs = max(1, min(16, (os.cpu_count() or 1), n // 200))
    if procs == 1:
        _write_images(str(root), wnids, seed, 0, n)
        return
    from concurrent.futures import ProcessPoolExecutor

    step = -(-n // procs)
    with ProcessPoolExecutor(procs) as pool:
        for f in [pool.submit(_write_images, str(root), wnids, seed, s, min(n, s + step)) for s in range(0, n, step)]:
            f.result()


def tree_stats(root: Path) -> Dict[str, float]:
    files = [f for d in root.iterdir() if d.is_dir() for f in d.iterdir()]
    return {"images": len(files), "mean_kb": sum(f.stat().st_size for f in files) / max(1, len(files)) / 1024}


def decode_rate(root: Path, workers: int, batch: int = 32, model_info: Dict[str, Any] = MODEL_INFO_224,
                pin_memory: bool = False, decode: str = "cpu", device: str = "cpu") -> Dict[str, float]:
    """Images/s of the data path alone: the project's ImageNet dataset (decode, resize, crop, to
    tensor) through a DataLoader with ``workers`` worker processes, one pass over the tree, worker
    start-up included (as a run pays it once). ``decode="gpu"``: the workers read bytes and
    ``batch_decode.BatchDecoder`` decodes each batch on ``device`` (what ``--decode gpu`` runs), timed to the
    last batch's images on the device."""
    import torch

    from .. import load_dataset
    from ..batch_decode import BatchDecoder, EncodedFiles, collate_encoded

    with warnings.catch_warnings():  # a generated tree is a sample by design: "a partial copy of ImageNet" is no news
        warnings.filterwarnings("ignore", message=r".*a partial copy")
        ds = load_dataset("imagenet", root=str(root), model_info=model_info)
    dev = torch.device(device)
    decoder = BatchDecoder(model_info, dev) if decode == "gpu" else None
    loader = torch.utils.data.DataLoader(EncodedFiles(ds) if decoder else ds, batch_size=batch, num_workers=workers,
                                         pin_memory=pin_memory, **({"collate_fn": collate_encoded} if decoder else {}))
    t = time.perf_counter()
    n = 0
    for x, _ in loader:
        x = decoder(x) if decoder is not None else x
        n += len(x)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    s = time.perf_counter() - t
    return {"images": n, "seconds": s, "img_s": n / s, "workers": workers, "decode": decode, "device": str(dev)}


def sensible_workers(cores: int) -> int:
    """DataLoader workers that leave the main process (and, on a GPU machine, its feeding thread)
    a core: 0 on <= 2 cores (decoding in the main process beats competing for them), else
    min(14, cores - 2)."""
    return 0 if cores <= 2 else min(14, cores - 2)
