"""ImageNet-C from the user's copy: ``<root>/[<category>/]<corruption>/<1..5>/<wnid>/*.JPEG`` (224x224).

One sample per (corruption, severity, image): 3.75M for the full set, so samples are computed per
index rather than held as objects. Files are already 224x224 (checked per file): a 224 model takes them
as they are, never resized or cropped again (the bug RobustBench fixed in its issue #59); a model of
another input size gets the whole image resized to its side with its interpolation (a centre crop would
pad a larger input with zeros), which provenance records. ``imagenet_root`` adds the clean condition,
measured on the same (wnid, file) ImageNet val images with the model's usual transform.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import Dataset

from ..errors import UserError
from ..core.imagenet_info import CORRUPTIONS_15, CORRUPTIONS_EXTRA, IMAGENET_C_CATEGORIES, SEVERITIES, wnid_to_index
from . import DatasetInfo, datasets
from .imagenet import (choose_subset, dataset_root, eval_transform, ids_sha256, imagenet_root_option, input_side,
                       interpolation, load_image, partial_tree, readable, scan_wnid_folders, subdirs)

SIDE = 224  # every ImageNet-C file is 224x224 (Hendrycks & Dietterich 2019)


def c_transform(model_info: Dict[str, Any]) -> Tuple[Any, Dict[str, Any]]:
    """ImageNet-C's transform for this model and its description: none at 224, else a resize of the whole
    224x224 image to the model's side."""
    from torchvision import transforms as T

    size = input_side(model_info)
    if size == SIDE:
        return T.ToTensor(), {"resize": None, "center_crop": None, "to_tensor": True, "normalize": "inside the model"}
    interp, mode = interpolation(model_info)
    return (T.Compose([T.Resize((size, size), interpolation=mode, antialias=True), T.ToTensor()]),
            {"resize": f"{SIDE}x{SIDE} -> {size}x{size} (the model's input size; ImageNet-C files are {SIDE}x{SIDE})",
             "interpolation": interp, "antialias": True, "center_crop": None, "to_tensor": True,
             "normalize": "inside the model"})

def scan_imagenet_c(root: Path, corruptions: Optional[Sequence[str]] = None) -> Dict[str, Path]:
    """corruption -> its folder, allowing one category level; checks the 1..5 severity folders."""
    known = set(CORRUPTIONS_15) | set(CORRUPTIONS_EXTRA)
    found: Dict[str, Path] = {}
    def add(c: Path) -> None:
        if c.name in found:
            raise UserError(f"imagenet-c: corruption {c.name!r} is both {found[c.name]} and {c}; keep one of them")
        found[c.name] = c

    for d in subdirs(root):
        if d.name in known:
            add(d)
        elif d.name in IMAGENET_C_CATEGORIES:
            for c in subdirs(d):
                if c.name not in known:
                    raise UserError(f"imagenet-c: {c} is not an ImageNet-C corruption folder (valid: "
                                    f"{', '.join(CORRUPTIONS_15 + CORRUPTIONS_EXTRA)})")
                add(c)
        else:
            raise UserError(f"imagenet-c: {d} is neither a corruption folder nor a category folder "
                            f"({', '.join(IMAGENET_C_CATEGORIES)}); expected <root>/<corruption>/<1..5>/<wnid>/")
    wanted = list(corruptions) if corruptions else list(CORRUPTIONS_15)
    missing = [c for c in wanted if c not in found]
    if missing:
        raise UserError(f"imagenet-c: corruption folder(s) missing under {root}: {', '.join(missing)} "
                        f"(expected {root}/<corruption>/<1..5>/<wnid>/*.JPEG; all 15 are needed for mCE)")
    order = [c for c in CORRUPTIONS_15 + CORRUPTIONS_EXTRA
             if c in found and (c in wanted or (not corruptions and c in CORRUPTIONS_EXTRA))]
    for c in order:
        for s in SEVERITIES:
            if not (found[c] / str(s)).is_dir():
                raise UserError(f"imagenet-c: severity folder {found[c] / str(s)} is missing "
                                f"(each corruption needs 1..5)")
    return {c: found[c] for c in order}


class _Lazy(Sequence):
    """A read-only sequence computed per index (ImageNet-C holds 3.75M samples: no per-sample objects)."""

    def __init__(self, n: int, fn: Any) -> None:
        self._n, self._fn = n, fn

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._fn(j) for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._fn(i)


class ImageNetCFiles(Dataset):
    """ImageNet-C as conditions x (wnid, file) keys: sample i is condition ``i // n_keys`` of key
    ``i % n_keys``; conditions are contiguous, in the standard order (clean first when present)."""

    def __init__(self, conditions: List[Tuple[str, Path]], keys: List[str], transform: Any,
                 transforms: Dict[str, Any], provenance: Dict[str, Any], skip_unreadable: bool = False) -> None:
        self.conds = conditions  # (condition, folder holding <wnid>/<file>)
        unreadable: List[str] = []
        if skip_unreadable:  # drop a bad (wnid, file) from every condition, so conditions stay paired
            bad = set()
            for c, folder in conditions:
                for k in keys:
                    if k not in bad and not readable(folder / k):
                        bad.add(k)
                        unreadable.append(str(folder / k))
            keys = [k for k in keys if k not in bad]
        self.keys = keys
        w2i = wnid_to_index()
        self.key_labels = [w2i[k.split("/", 1)[0]] for k in keys]
        self.transform, self.transforms = transform, transforms
        n, nk = len(conditions) * len(keys), max(1, len(keys))
        self.sample_ids = _Lazy(n, lambda i: f"{self.conds[i // nk][0]}/{self.keys[i % nk]}")
        self.labels = _Lazy(n, lambda i: self.key_labels[i % nk])
        self.conditions = _Lazy(n, lambda i: self.conds[i // nk][0])
        self.n_unreadable = len(unreadable)
        self.info = datasets.get("imagenet-c")
        self.provenance = {**provenance, "dataset": "imagenet-c", "n": n, "n_per_condition": len(keys),
                           "skip_unreadable": skip_unreadable, "n_unreadable": len(unreadable),
                           "unreadable": unreadable[:100],
                           "sample_ids_sha256": ids_sha256([f"{c}/{k}" for c, _ in conditions for k in keys])}

    def __len__(self) -> int:
        return len(self.conds) * len(self.keys)

    def path(self, i: int) -> Path:
        c, folder = self.conds[i // len(self.keys)]
        return folder / self.keys[i % len(self.keys)]

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        cond = self.conds[i // len(self.keys)][0]
        img = load_image(self.path(i))
        if cond != "clean" and img.size != (SIDE, SIDE):
            raise UserError(f"imagenet-c: {self.path(i)} is {img.size[0]}x{img.size[1]}, not {SIDE}x{SIDE} as every "
                            f"ImageNet-C file is; replace it with the file from the ImageNet-C archive")
        return self.transforms.get(cond, self.transform)(img), self.key_labels[i % len(self.keys)]

    def encoded(self, i: int) -> Tuple[Path, str, int]:
        """(file, transform kind, label) of sample i for ``--decode gpu``: the clean condition takes the model's
        eval transform, the corrupted files ImageNet-C's (``batch_decode.tensor_steps``)."""
        cond = self.conds[i // len(self.keys)][0]
        return self.path(i), "eval" if cond == "clean" else "c", self.key_labels[i % len(self.keys)]


def _keys(root: Path) -> List[str]:
    """Sorted "<wnid>/<file>" of a <wnid>/<image> tree, with the usual checks (names the path)."""
    return [it.sample_id for it in scan_wnid_folders(root, "imagenet-c")]


def _robustbench_keys(conds: List[Tuple[str, Path]], n: Optional[int]) -> Tuple[List[str], Dict[str, Any]]:
    """RobustBench's ImageNet-C images (``--suite robustbench-corruptions``): the first ``n`` (default all 5,000) of
    its id list, in the list's order, each present in every condition (a missing one is refused, never skipped)."""
    from ..core import robustbench as rb

    ids = list(rb.imagenet_subset())
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(ids)):
        raise UserError(f"imagenet-c: the images per cell (--limit under --suite robustbench-corruptions) must be a "
                        f"whole number 1..{len(ids):,}, got {n!r}")
    ids = ids[:n] if n else ids
    for cond, folder in conds:
        missing = [i for i in ids if not (folder / i).is_file()]
        if missing:
            raise UserError(f"imagenet-c: {len(missing):,} of RobustBench's {len(ids):,} listed images are missing "
                            f"from {folder}, e.g. {missing[0]}; restore them from the ImageNet-C archive")
    info = rb.facts()["imagenet_subset"]
    return ids, {"sample_list": {"name": "robustbench", "source": f"{rb.source()}: {info['copied_from']}",
                                 "sha256": info["sha256"], "n": len(ids), "order": "the list's"}}


def _imagenet_c(split: str, root: Optional[str], model_info: Dict[str, Any], subset: Optional[int] = None,
                subset_seed: int = 0, skip_unreadable: bool = False, corruptions: Optional[Sequence[str]] = None,
                imagenet_root: Optional[str] = None, clean: Optional[bool] = None, sample_list: Optional[str] = None,
                n_per_cell: Optional[int] = None) -> ImageNetCFiles:
    r = dataset_root(root, "imagenet-c")
    if (r / "ImageNet-C").is_dir():  # RobustBench's data_dir, which holds ImageNet-C/
        r = r / "ImageNet-C"
    folders = scan_imagenet_c(r, corruptions)
    conds: List[Tuple[str, Path]] = [(f"{c}/{s}", d / str(s)) for c, d in folders.items() for s in SEVERITIES]
    if sample_list not in (None, "robustbench") or (n_per_cell is not None and sample_list is None):
        raise UserError(f"imagenet-c: sample list {sample_list!r} / images per cell {n_per_cell!r}: only RobustBench's "
                        f"list ('robustbench', --suite robustbench-corruptions) is known")
    if sample_list is not None and subset is not None:
        raise UserError("imagenet-c: --subset and RobustBench's sample list are two sample sets; drop --subset")
    if sample_list is not None:
        keys, listed = _robustbench_keys(conds, n_per_cell)
        return _finish_c(r, folders, conds, keys, listed, model_info, imagenet_root, clean, skip_unreadable)
    keys = _keys(conds[0][1])
    extra: Dict[str, Any] = {"corruptions": list(folders), "severities": list(SEVERITIES),
                             "n_per_condition_found": len(keys)}
    for cond, folder in conds[1:]:  # every condition must hold the same images
        have = set(_keys(folder))
        if have != set(keys):
            diff = sorted(set(keys) - have) or sorted(have - set(keys))
            what = "is missing" if set(keys) - have else "is not in the other conditions"
            raise UserError(f"imagenet-c: {folder / diff[0]} {what} (every condition must hold the same images)")
    if subset is None:
        extra.update(partial_tree("imagenet-c", {"imagenet-c": len(keys)}))
    if subset is not None:
        keys = [keys[i] for i in choose_subset(len(keys), subset, subset_seed)]
        extra["subset"] = {"n": subset, "seed": subset_seed, "rule": "the same sorted(default_rng(seed).choice("
                           "n, k, replace=False)) (wnid, file) pairs in every condition"}
    return _finish_c(r, folders, conds, keys, extra, model_info, imagenet_root, clean, skip_unreadable)


def _finish_c(r: Path, folders: Dict[str, Path], conds: List[Tuple[str, Path]], keys: List[str],
              extra: Dict[str, Any], model_info: Dict[str, Any], imagenet_root: Optional[str], clean: Optional[bool],
              skip_unreadable: bool) -> ImageNetCFiles:
    """The dataset of these conditions and keys: the clean condition (the model's own eval transform) first when
    the ImageNet root is given."""
    extra = {"corruptions": list(folders), "severities": list(SEVERITIES), **extra}
    tf, desc = c_transform(model_info)
    transforms: Dict[str, Any] = {}
    want_clean = clean if clean is not None else bool(imagenet_root)
    if want_clean:
        val = imagenet_root_option(imagenet_root, "imagenet-c's clean condition")
        for k in keys:
            if not (val / k).is_file():
                raise UserError(f"imagenet-c clean condition: {val / k} is missing from the ImageNet root")
        conds.insert(0, ("clean", val))
        transforms["clean"], extra["clean_transform"] = eval_transform(model_info)
        extra["imagenet_root"] = str(val)
    prov = {"root": str(r), "transform": desc, **extra}
    return ImageNetCFiles(conds, keys, tf, transforms, prov, skip_unreadable=skip_unreadable)


datasets.add("imagenet-c", DatasetInfo(
    "imagenet-c", "imagenet", 1000, "ImageNet-C, <root>/[<category>/]<corruption>/<1..5>/<wnid>/*.JPEG (224x224)",
    splits=("test",), needs_root=True, default_benchmark="imagenet_c", samples="corrupted", factory=_imagenet_c))
