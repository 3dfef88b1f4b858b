"""The ImageNet family, read from the user's own copies in their published layouts (ImageNet-C's
per-condition dataset is in ``imagenet_c.py``; the shared scanning and transforms are here).

=================  ==========================================================  =====================
dataset            layout under ``--data-root``                                label
=================  ==========================================================  =====================
imagenet           ``<wnid>/*.JPEG`` (or ``val/<wnid>/*.JPEG``), 1000 wnids    index in sorted wnids
imagenet-c         ``<corruption>/<1..5>/<wnid>/*.JPEG``, optionally under a   index in sorted wnids
                   category folder (``noise/``, ``blur/``, ``weather/``,
                   ``digital/``, ``extra/``)
imagenet-a, -r     ``<wnid>/*`` with the 200 wnids of the dataset              index in sorted wnids
imagenet-o         ``<wnid>/*`` (200 O wnids) = OOD; in-distribution = the     index in sorted wnids
                   ImageNet val images of the same 200 wnids (ImageNet root)
imagenet-v2        ``<0..999>/*.jpeg``                                         ``int(folder)``
imagenet-sketch    ``<wnid>/*`` (or ``sketch/<wnid>/*``), 1000 wnids           index in sorted wnids
=================  ==========================================================  =====================

Transforms: Resize(floor(size / crop_pct), model interpolation) + CenterCrop(size) from the
model's config (DeiT: bicubic 256 -> 224; timm's ``crop_mode`` squash / border honoured), except ImageNet-C whose files are already 224x224
(CenterCrop(size) only, a no-op at 224: resizing them is the bug RobustBench fixed in its issue #59).
The transform is recorded in ``.provenance``.

Splits: ``imagenet`` is the labelled validation set (``val``; the test set's labels are not public);
the robustness sets (-C, -A, -R, -O, -V2, -Sketch) are each one published test set (``test``).

The ImageNet root for ImageNet-O's in-distribution half (and the optional clean condition of
ImageNet-C) is the dataset option ``imagenet_root`` (``--imagenet-root``). The environment
variable ``ROBUSTBENCH_PID_IMAGENET_ROOT`` is only that option's default, filled in when the spec
is built (``spec_builder``), so the root is in the spec and the run folder's hash; nothing here
reads the environment.

``subset=N`` (``--subset N``): the N samples at positions ``sorted(default_rng(seed).choice(len,
N, replace=False))`` of the sorted file list (seed = ``--seed``, default 0); for ImageNet-C the
same N (wnid, file) pairs in every condition; for ImageNet-O N images in the published 1:5
OOD : in-distribution ratio. The sha256 of the chosen sample ids is recorded.

Unreadable or truncated images are a hard error naming the file; with ``skip_unreadable`` every
image is decoded once up front and bad ones are dropped and counted (``provenance["unreadable"]``
and the ``skipped_unreadable`` column of the records of the ImageNet benchmarks).
"""
from __future__ import annotations

import hashlib
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import UserError
from ..core.imagenet_info import PUBLISHED_COUNTS, subset_indices, subset_wnids, wnid_to_index
from . import DatasetInfo, datasets

IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png")
IMAGENET_ROOT_ENV = "ROBUSTBENCH_PID_IMAGENET_ROOT"


@dataclass(frozen=True)
class Item:
    path: Path
    label: int
    sample_id: str
    condition: str = ""
    ood: bool = False


# --------------------------------------------------------------------------- transforms

def input_side(model_info: Dict[str, Any]) -> int:
    """The model's square input side in pixels (224 when it does not say)."""
    return int((model_info.get("input_size") or (3, 224, 224))[-1])


def interpolation(model_info: Dict[str, Any]) -> Tuple[str, Any]:
    """The model's resize interpolation: its name and torchvision's mode."""
    from torchvision import transforms as T

    interp = str(model_info.get("interpolation") or "bicubic")
    modes = {"bicubic": T.InterpolationMode.BICUBIC, "bilinear": T.InterpolationMode.BILINEAR,
             "nearest": T.InterpolationMode.NEAREST}
    if interp not in modes:
        raise UserError(f"model interpolation {interp!r} is not supported (use one of {', '.join(modes)})")
    return interp, modes[interp]


CROP_MODES = ("center", "squash", "border")


def eval_transform(model_info: Dict[str, Any]) -> Tuple[Any, Dict[str, Any]]:
    """The model's evaluation transform and its description (for provenance).

    ``crop_mode`` as in timm's configs: ``center`` (default) resizes the short side to size / crop_pct and
    crops the centre; ``squash`` resizes both sides to it (aspect not kept), then crops; ``border`` resizes
    the long side to it and pads to the square with the model's mean colour (timm's ``ResizeKeepRatio``
    and ``CenterCropOrPad``, used as they are so the pixels match timm's)."""
    from torchvision import transforms as T

    size = input_side(model_info)
    crop_pct = float(model_info.get("crop_pct") or 0.875)
    interp, mode = interpolation(model_info)
    crop_mode = str(model_info.get("crop_mode") or "center")
    if crop_mode not in CROP_MODES:
        raise UserError(f"model crop_mode {crop_mode!r} is not supported (use one of {', '.join(CROP_MODES)})")
    scale = int(math.floor(size / crop_pct))
    if crop_mode == "center":
        resize = [T.Resize(scale, interpolation=mode, antialias=True), T.CenterCrop(size)]
    elif crop_mode == "squash":
        resize = [T.Resize((scale, scale), interpolation=mode, antialias=True), T.CenterCrop(size)]
    else:
        from timm.data.transforms import CenterCropOrPad, ResizeKeepRatio

        fill = tuple(round(255 * float(v)) for v in (model_info.get("mean") or (0.0, 0.0, 0.0)))
        resize = [ResizeKeepRatio((scale, scale), interpolation=interp, longest=1.0),
                  CenterCropOrPad(size, fill=fill)]
    tf = T.Compose([*resize, T.ToTensor()])
    desc = {"resize": scale, "interpolation": interp, "antialias": True, "crop_mode": crop_mode,
            "center_crop": size, "crop_pct": crop_pct, "to_tensor": True, "normalize": "inside the model"}
    return tf, desc


# --------------------------------------------------------------------------- scanning

def dataset_root(root: Optional[str], name: str) -> Path:
    if not root:
        raise UserError(f"dataset {name!r} needs --data-root DIR (your local copy; nothing is downloaded)")
    p = Path(root).expanduser()
    if not p.is_dir():
        raise UserError(f"{name}: data root {p} does not exist or is not a folder; pass --data-root DIR "
                        f"pointing at your copy")
    return p


def _images(folder: Path) -> List[Path]:
    files = sorted(f for f in folder.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_EXTENSIONS)
    if not files:
        raise UserError(f"class folder {folder} holds no images ({', '.join(IMAGE_EXTENSIONS)}); "
                        f"remove it or restore its files")
    return files


def subdirs(folder: Path) -> List[Path]:
    return sorted(d for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))


def _descend(root: Path, inner: str, name: str) -> Path:
    """Accept both ``root/<classes>`` and ``root/<inner>/<classes>``."""
    if (root / inner).is_dir() and not any(d.name in wnid_to_index() for d in subdirs(root)):
        return root / inner
    return root


def scan_wnid_folders(root: Path, name: str, allowed: Optional[Sequence[str]] = None,
                      prefix: str = "", condition: str = "", ood: bool = False) -> List[Item]:
    """Items of a ``<wnid>/<image>`` tree; labels are indices into the 1000 sorted wnids."""
    w2i = wnid_to_index()
    allowed_set = set(allowed) if allowed is not None else set(w2i)
    dirs = subdirs(root)
    if not dirs:
        raise UserError(f"{name}: no class folders under {root}; expected {root}/<wnid>/*.JPEG")
    items: List[Item] = []
    for d in dirs:
        if d.name not in allowed_set:
            what = "an ImageNet class (wnid)" if d.name not in w2i else f"one of the 200 {name} classes"
            raise UserError(f"{name}: folder {d} is not {what}; remove it or point --data-root at the "
                            f"folder that holds the class folders")
        for f in _images(d):
            items.append(Item(f, w2i[d.name], f"{prefix}{d.name}/{f.name}", condition, ood))
    other = [f for d in dirs for f in d.iterdir()
             if f.is_file() and not f.name.startswith(".") and f.suffix.lower() not in IMAGE_EXTENSIONS]
    if other:
        warnings.warn(f"{name}: {len(other)} file(s) under {root} are not read (not {', '.join(IMAGE_EXTENSIONS)}), "
                      f"e.g. {other[0]}; convert them to JPEG/PNG or remove them", stacklevel=2)
    return items


def choose_subset(n_total: int, n: int, seed: int) -> List[int]:
    """The documented subset: sorted positions drawn without replacement by ``default_rng(seed)``."""
    if n < 1:
        raise UserError(f"--subset must be >= 1, got {n}")
    if n >= n_total:
        return list(range(n_total))
    return sorted(int(i) for i in np.random.default_rng(seed).choice(n_total, size=n, replace=False))


def ids_sha256(ids: Sequence[str]) -> str:
    return hashlib.sha256("".join(f"{s}\n" for s in ids).encode()).hexdigest()


# --------------------------------------------------------------------------- the dataset

class ImageFiles(Dataset):
    """Image files with labels; yields (CxHxW float in [0, 1], label)."""

    def __init__(self, name: str, items: List[Item], transform: Any, provenance: Dict[str, Any],
                 skip_unreadable: bool = False, transforms: Optional[Dict[str, Any]] = None,
                 logit_indices: Optional[Sequence[int]] = None) -> None:
        self.name = name
        self.transform = transform
        # per-condition transforms (ImageNet-C's clean condition is resized; its corrupted files are not)
        self.transforms = transforms or {}
        unreadable: List[str] = []
        if skip_unreadable:
            good = []
            for it in items:
                if readable(it.path):
                    good.append(it)
                else:
                    unreadable.append(str(it.path))
            items = good
        self.items = items
        self.sample_ids: List[str] = [it.sample_id for it in items]
        self.labels: List[int] = [it.label for it in items]
        self.conditions: List[str] = [it.condition for it in items]
        self.ood: List[bool] = [it.ood for it in items]
        self.logit_indices = list(logit_indices) if logit_indices is not None else None
        self.n_unreadable = len(unreadable)
        self.info = datasets.get(name)
        self.provenance = {**provenance, "dataset": name, "n": len(items), "skip_unreadable": skip_unreadable,
                           "n_unreadable": len(unreadable), "unreadable": unreadable[:100],
                           "sample_ids_sha256": ids_sha256(self.sample_ids)}

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        it = self.items[i]
        img = load_image(it.path)
        tf = self.transforms.get(it.condition, self.transform)
        return tf(img), it.label

    def encoded(self, i: int) -> Tuple[Path, str, int]:
        """(file, transform kind, label) of sample i: what ``--decode gpu`` reads (``batch_decode``)."""
        return self.items[i].path, "eval", self.items[i].label


def load_image(path: Path) -> Any:
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.load()
            return im.convert("RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        # DecompressionBombError (PIL's pixel limit, not an OSError): a file too large to decode safely
        raise UserError(f"cannot read image {path}: {exc}. Replace the file, or pass --skip-unreadable to skip "
                        f"(and count) unreadable images") from None


def readable(path: Path) -> bool:
    try:
        load_image(path)
        return True
    except UserError:
        return False


# --------------------------------------------------------------------------- factories

def partial_tree(name: str, found: Dict[str, int]) -> Dict[str, Any]:
    """Provenance's ``partial`` entry (empty when complete) for a tree read whole (no ``--subset``): a copy with
    fewer images than the published set gives numbers that look complete but are not comparable with
    published ones, so it is recorded and said once on stderr."""
    short = {k: (n, PUBLISHED_COUNTS[k]) for k, n in found.items() if n < PUBLISHED_COUNTS.get(k, 0)}
    if not short:
        return {}
    what = "; ".join(f"{n:,} of the published {full:,} images of {k}" for k, (n, full) in short.items())
    warnings.warn(f"{name}: found {what}: its numbers are not comparable with published ones (a partial copy; "
                  f"for a deliberate sample say so with --subset N)", stacklevel=2)
    return {"partial": {k: {"found": n, "published": full} for k, (n, full) in short.items()}}


def _finish(name: str, items: List[Item], tf: Any, desc: Dict[str, Any], root: Path, subset: Optional[int],
            subset_seed: int, skip_unreadable: bool, extra: Optional[Dict[str, Any]] = None, **kw: Any) -> ImageFiles:
    prov: Dict[str, Any] = {"root": str(root), "transform": desc, "n_found": len(items), **(extra or {})}
    if subset is None:
        prov.update(partial_tree(name, {name: len(items)}))
    if subset is not None:
        pos = choose_subset(len(items), subset, subset_seed)
        items = [items[i] for i in pos]
        prov["subset"] = {"n": subset, "seed": subset_seed,
                          "rule": "sorted(numpy.random.default_rng(seed).choice(n_found, n, replace=False))"}
    return ImageFiles(name, items, tf, prov, skip_unreadable=skip_unreadable, **kw)


def _imagenet_val(split: str, root: Optional[str], model_info: Dict[str, Any], subset: Optional[int] = None,
                  subset_seed: int = 0, skip_unreadable: bool = False, sample_list: Optional[str] = None) -> ImageFiles:
    r = _descend(dataset_root(root, "imagenet"), "val", "imagenet")
    tf, desc = eval_transform(model_info)
    if sample_list is not None:  # --suite robustbench: the leaderboard's own images, in its order
        from .robustbench_subset import listed_items

        if subset is not None:
            raise UserError("imagenet: --subset draws its own sample; RobustBench's sample list is fixed: drop --subset")
        listed, extra = listed_items(r, sample_list)
        items = [Item(path, label, sid) for path, label, sid in listed]
        return ImageFiles("imagenet", items, tf, {"root": str(r), "transform": desc, **extra},
                          skip_unreadable=skip_unreadable)
    items = scan_wnid_folders(r, "imagenet")
    return _finish("imagenet", items, tf, desc, r, subset, subset_seed, skip_unreadable,
                   {"n_classes_present": len({it.label for it in items})})


def _restricted(name: str, key: str):
    def factory(split: str, root: Optional[str], model_info: Dict[str, Any], subset: Optional[int] = None,
                subset_seed: int = 0, skip_unreadable: bool = False) -> ImageFiles:
        r = _descend(dataset_root(root, name), name, name)
        tf, desc = eval_transform(model_info)
        items = scan_wnid_folders(r, name, allowed=subset_wnids(key))
        return _finish(name, items, tf, desc, r, subset, subset_seed, skip_unreadable,
                       {"logit_mask": f"{name} 200 classes (timm/data/_info/imagenet_{key}_indices.txt)"},
                       logit_indices=subset_indices(key))

    return factory


def imagenet_root_option(opt: Optional[str], who: str) -> Path:
    if not opt:
        raise UserError(f"{who} needs the ImageNet validation set too: pass --imagenet-root DIR (the folder "
                        f"holding val/<wnid>/*.JPEG or <wnid>/*.JPEG; its default is ${IMAGENET_ROOT_ENV}) "
                        f"(Python: imagenet_root=DIR)")
    p = Path(opt).expanduser()
    if not p.is_dir():
        raise UserError(f"ImageNet root {p} (--imagenet-root, default ${IMAGENET_ROOT_ENV}) is not a "
                        f"folder; pass --imagenet-root DIR with the ImageNet validation images")
    return _descend(p, "val", "imagenet")


def _imagenet_o(split: str, root: Optional[str], model_info: Dict[str, Any], subset: Optional[int] = None,
                subset_seed: int = 0, skip_unreadable: bool = False,
                imagenet_root: Optional[str] = None) -> ImageFiles:
    r = _descend(dataset_root(root, "imagenet-o"), "imagenet-o", "imagenet-o")
    o_wnids = subset_wnids("o")
    ood = scan_wnid_folders(r, "imagenet-o", allowed=o_wnids, prefix="imagenet-o/", condition="ood", ood=True)
    val = imagenet_root_option(imagenet_root, "imagenet-o")
    ind: List[Item] = []
    for w in o_wnids:
        d = val / w
        if not d.is_dir():
            raise UserError(f"imagenet-o: the in-distribution class folder {d} is missing from the ImageNet root "
                            f"(all 200 ImageNet-O wnids are needed)")
        ind.extend(Item(f, wnid_to_index()[w], f"imagenet-val/{w}/{f.name}", "in", False) for f in _images(d))
    extra = {"imagenet_root": str(val), "n_in_found": len(ind), "n_ood_found": len(ood),
             "in_distribution": "ImageNet val images of the 200 ImageNet-O wnids",
             "logit_mask": "ImageNet-O 200 classes (robustbench_pid/core/_data/imagenet_o_wnids.txt)"}
    if subset is None:
        extra.update(partial_tree("imagenet-o", {"imagenet-o": len(ood), "imagenet-o-in": len(ind)}))
    if subset is not None:
        if subset < 2:
            raise UserError(f"imagenet-o: --subset {subset} is too small: AUPR needs images of both halves (OOD and "
                            f"in-distribution); use --subset 2 or more")
        n_ood = max(1, round(subset * len(ood) / (len(ood) + len(ind))))
        n_in = max(1, subset - n_ood)
        ind = [ind[i] for i in choose_subset(len(ind), n_in, subset_seed)]
        ood = [ood[i] for i in choose_subset(len(ood), n_ood, subset_seed)]
        extra["subset"] = {"n": subset, "seed": subset_seed, "n_in": len(ind), "n_ood": len(ood),
                           "rule": "per part, sorted(default_rng(seed).choice(n_part, k, replace=False)); "
                                   "k keeps the OOD : in ratio"}
    tf, desc = eval_transform(model_info)
    prov = {"root": str(r), "transform": desc, **extra}
    return ImageFiles("imagenet-o", ind + ood, tf, prov, skip_unreadable=skip_unreadable,
                      logit_indices=subset_indices("o"))


def _imagenet_v2(split: str, root: Optional[str], model_info: Dict[str, Any], subset: Optional[int] = None,
                 subset_seed: int = 0, skip_unreadable: bool = False) -> ImageFiles:
    r = dataset_root(root, "imagenet-v2")
    dirs = subdirs(r)
    if not dirs:
        raise UserError(f"imagenet-v2: no class folders under {r}; expected {r}/<0..999>/*.jpeg")
    items: List[Item] = []
    for d in sorted(dirs, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name)):
        if not (d.name.isdigit() and 0 <= int(d.name) < 1000 and str(int(d.name)) == d.name):
            raise UserError(f"imagenet-v2: folder {d} is not a class folder 0..999 (labels are int(folder))")
        items.extend(Item(f, int(d.name), f"{d.name}/{f.name}") for f in _images(d))
    tf, desc = eval_transform(model_info)
    return _finish("imagenet-v2", items, tf, desc, r, subset, subset_seed, skip_unreadable,
                   {"labels": "int(folder name)"})


def _imagenet_sketch(split: str, root: Optional[str], model_info: Dict[str, Any], subset: Optional[int] = None,
                     subset_seed: int = 0, skip_unreadable: bool = False) -> ImageFiles:
    r = _descend(dataset_root(root, "imagenet-sketch"), "sketch", "imagenet-sketch")
    tf, desc = eval_transform(model_info)
    items = scan_wnid_folders(r, "imagenet-sketch")
    return _finish("imagenet-sketch", items, tf, desc, r, subset, subset_seed, skip_unreadable)


datasets.add("imagenet", DatasetInfo(
    "imagenet", "imagenet", 1000, "ImageNet-1k validation (50,000), <root>/[val/]<wnid>/*.JPEG",
    splits=("val",), needs_root=True, default_benchmark="adversarial", factory=_imagenet_val))
datasets.add("imagenet-a", DatasetInfo(
    "imagenet-a", "imagenet", 1000, "ImageNet-A (7,500), <root>/<wnid>/*.jpg, 200 classes (masked logits)",
    splits=("test",), needs_root=True, default_benchmark="restricted", samples="restricted",
    factory=_restricted("imagenet-a", "a")))
datasets.add("imagenet-r", DatasetInfo(
    "imagenet-r", "imagenet", 1000, "ImageNet-R (30,000), <root>/<wnid>/*.jpg, 200 classes (masked logits)",
    splits=("test",), needs_root=True, default_benchmark="restricted", samples="restricted",
    factory=_restricted("imagenet-r", "r")))
datasets.add("imagenet-o", DatasetInfo(
    "imagenet-o", "imagenet", 1000,
    "ImageNet-O (2,000 OOD) vs ImageNet val of its 200 wnids (10,000; --imagenet-root)",
    splits=("test",), needs_root=True, default_benchmark="ood", samples="ood", factory=_imagenet_o))
datasets.add("imagenet-v2", DatasetInfo(
    "imagenet-v2", "imagenet", 1000, "ImageNetV2 (10,000), <root>/<0..999>/*.jpeg, label = int(folder)",
    splits=("test",), needs_root=True, default_benchmark="adversarial", factory=_imagenet_v2))
datasets.add("imagenet-sketch", DatasetInfo(
    "imagenet-sketch", "imagenet", 1000, "ImageNet-Sketch (50,889), <root>/[sketch/]<wnid>/*.JPEG",
    splits=("test",), needs_root=True, default_benchmark="adversarial", factory=_imagenet_sketch))
