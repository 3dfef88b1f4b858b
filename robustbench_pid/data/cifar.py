"""CIFAR-10 from the user's own copy, in the order of the published batches (RobustBench's CIFAR-10 leaderboard
runs the 10,000 test images in the order of ``test_batch``; facts and sources: ``core/_data/robustbench.json``).

Layouts under ``--data-root`` (nothing is downloaded):

- the standard pickled batches, ``cifar-10-batches-py/`` (or that folder itself): ``test_batch`` for ``test``,
  ``data_batch_1`` .. ``_5`` for ``train``; each a pickled dict with ``data`` (n, 3072) uint8, channel-major
  3x32x32, and ``labels``. A pickle can run code while it loads, so it is read with an unpickler that builds
  dicts, lists, text, numbers and numpy arrays and refuses anything else. Whether each file is the published
  one (its md5, as torchvision records it) goes into the provenance;
- a folder of images, ``[<split>/]<class name>/<name><index>.png``: the number that ends each file name is the
  image's position in the split (as converters that keep the batch index write it), so the order is the
  batches' and not the file system's; a name without one, an index twice, or a folder that is no CIFAR-10
  class is refused. Use lossless PNG: a JPEG copy holds other pixels.

Sample ids are ``<split>/<index>`` in both layouts, so runs on either compare sample by sample. Images are
[0, 1] floats, 3x32x32 (ToTensor only, as RobustBench reads CIFAR-10).
"""
from __future__ import annotations

import hashlib
import io
import pickle
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from ..core.robustbench import cifar10 as facts
from ..errors import UserError
from . import DatasetInfo, datasets

_INDEX = re.compile(r"(\d+)$")
_ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}


class _ArraysOnly(pickle.Unpickler):
    """Builds the batches' dicts and arrays; any other global (a function a pickle could call) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a CIFAR-10 batch")


def _batch(path: Path) -> Tuple[np.ndarray, np.ndarray, bool]:
    """(images (n, 3, 32, 32) uint8, labels, is the published file) of one pickled batch."""
    try:
        raw = path.read_bytes()
        d = _ArraysOnly(io.BytesIO(raw), encoding="latin1").load()
        data = np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        labels = np.asarray(d["labels"], dtype=np.int64)
    except (OSError, pickle.UnpicklingError, KeyError, TypeError, ValueError, EOFError) as exc:
        raise UserError(f"cannot read CIFAR-10 batch {path}: {exc}. It must be the python version's pickled batch "
                        f"(cifar-10-python.tar.gz); replace the file") from None
    if len(data) != len(labels) or (len(labels) and not (0 <= labels.min() and labels.max() <= 9)):
        raise UserError(f"CIFAR-10 batch {path}: {len(data)} images but {len(labels)} labels in 0..9; replace the file")
    published = hashlib.md5(raw).hexdigest() == facts()["md5"].get(path.name)  # noqa: S324 - the published md5
    return data, labels, published


def _pickles(root: Path, split: str) -> Optional[Tuple[np.ndarray, np.ndarray, Dict[str, Any]]]:
    folder = root / facts()["folder"] if (root / facts()["folder"]).is_dir() else root
    names = [facts()["test_batch"]] if split == "test" else list(facts()["train_batches"])
    if not any((folder / n).is_file() for n in names):
        return None
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise UserError(f"cifar10: {folder} lacks {', '.join(missing)} of the {split} split; restore them")
    parts = [_batch(folder / n) for n in names]
    prov = {"layout": "pickled batches", "files": names, "published_md5": all(p[2] for p in parts)}
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), prov


def _folder(root: Path, split: str) -> Tuple[List[Tuple[int, Path, int]], Dict[str, Any]]:
    base = root / split if (root / split).is_dir() else root
    classes = list(facts()["classes"])
    dirs = sorted(d for d in base.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not dirs:
        raise UserError(f"cifar10: {root} holds neither the pickled batches ({facts()['folder']}/"
                        f"{facts()['test_batch']}) nor class folders ({split}/<class>/<index>.png); point --data-root "
                        f"at your copy")
    items, seen = [], {}
    for d in dirs:
        if d.name not in classes:
            raise UserError(f"cifar10: folder {d} is no CIFAR-10 class ({', '.join(classes)}); remove it")
        for f in sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith(".")):
            m = _INDEX.search(f.stem)
            if m is None:
                raise UserError(f"cifar10: {f} has no index at the end of its name, so its place in the {split} set "
                                f"is unknown; name files <name><index>.png (e.g. 42.png) or use the pickled batches")
            i = int(m.group(1))
            if i in seen:
                raise UserError(f"cifar10: index {i} is taken by both {seen[i]} and {f}; each image's index must be "
                                f"its own")
            seen[i] = f
            items.append((i, f, classes.index(d.name)))
    items.sort()
    return items, {"layout": "image folder", "index_rule": "the number ending each file name"}


class Cifar10(Dataset):
    def __init__(self, split: str, root: Path) -> None:
        got = _pickles(root, split)
        self.paths: Optional[List[Path]] = None
        if got is not None:
            self.images, labels, prov = got
            positions = list(range(len(labels)))
        else:
            items, prov = _folder(root, split)
            positions = [i for i, _, _ in items]
            self.paths = [p for _, p, _ in items]
            labels = np.asarray([c for _, _, c in items], dtype=np.int64)
        self.labels = labels
        self.sample_ids: List[str] = [f"{split}/{i}" for i in positions]
        full = 10000 if split == "test" else 50000
        self.info = datasets.get("cifar10")
        self.provenance = {"dataset": "cifar10", "split": split, "root": str(root), "n": len(labels),
                           "transform": {"to_tensor": True, "normalize": "inside the model"}, **prov,
                           **({"partial": {"found": len(labels), "published": full}} if len(labels) != full else {})}

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        if self.paths is None:
            x = torch.from_numpy(self.images[i].astype(np.float32) / 255.0)
        else:
            from .imagenet import load_image

            arr = np.asarray(load_image(self.paths[i]), dtype=np.uint8)
            if arr.shape != (32, 32, 3):
                raise UserError(f"cifar10: {self.paths[i]} is {arr.shape[1]}x{arr.shape[0]}, not 32x32; replace it")
            x = torch.from_numpy(arr.transpose(2, 0, 1).astype(np.float32) / 255.0)
        return x, int(self.labels[i])


def _factory(split: str, root: Optional[str], model_info: Dict[str, Any]) -> Cifar10:
    """No options: the leaderboard's sample set is the whole split in order (``--limit N`` takes its first N)."""
    if not root or not Path(root).expanduser().is_dir():
        raise UserError(f"cifar10: data root {root} is not a folder; pass --data-root DIR holding "
                        f"cifar-10-batches-py/ (or <split>/<class>/<index>.png)")
    return Cifar10(split, Path(root).expanduser())


datasets.add("cifar10", DatasetInfo(
    "cifar10", "cifar10", 10,
    "CIFAR-10 (10,000 test / 50,000 train) in the batches' order: cifar-10-batches-py/ or <split>/<class>/<index>.png",
    splits=("test", "train"), needs_root=True, factory=_factory))
