"""CIFAR-10 and CIFAR-100 from the user's own copy, in the order of the published files (RobustBench's CIFAR
leaderboards run the 10,000 test images in the order of ``test_batch`` / ``test``; facts and sources:
``core/_data/robustbench.json``). One module for both: the two differ only in folder, file names, label key and
class names (the facts), not in format.

Layouts under ``--data-root`` (nothing is downloaded):

- the standard pickled files, ``cifar-10-batches-py/`` (``test_batch``; ``data_batch_1`` .. ``_5`` for ``train``)
  or ``cifar-100-python/`` (``test``; ``train``), or that folder itself; each a pickled dict with ``data``
  (n, 3072) uint8, channel-major 3x32x32, and ``labels`` (CIFAR-100: ``fine_labels``, the 100 classes). A pickle
  can run code while it loads, so it is read with an unpickler that builds dicts, lists, text, numbers and numpy
  arrays and refuses anything else. Whether each file is the published one (its md5, as torchvision records it)
  goes into the provenance;
- a folder of images, ``[<split>/]<class name>/<name><index>.png``: the number that ends each file name is the
  image's position in the split (as converters that keep the file's index write it), so the order is the
  published one and not the file system's; a name without one, an index twice, or a folder that is no class of
  the dataset is refused. Use lossless PNG: a JPEG copy holds other pixels.

Sample ids are ``<split>/<index>`` in both layouts, so runs on either compare sample by sample. Images are
[0, 1] floats, 3x32x32 (ToTensor only, as RobustBench reads CIFAR).
"""
from __future__ import annotations

import hashlib
import io
import pickle
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from ..core.robustbench import cifar as facts
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
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a CIFAR batch")


def _title(name: str) -> str:
    return {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}[name]


def _batch(name: str, path: Path) -> Tuple[np.ndarray, np.ndarray, bool]:
    """(images (n, 3, 32, 32) uint8, labels, is the published file) of one pickled file of dataset ``name``."""
    f = facts(name)
    top = len(f["classes"]) - 1
    try:
        raw = path.read_bytes()
        d = _ArraysOnly(io.BytesIO(raw), encoding="latin1").load()
        data = np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        labels = np.asarray(d[f["label_key"]], dtype=np.int64)
    except (OSError, pickle.UnpicklingError, KeyError, TypeError, ValueError, EOFError) as exc:
        raise UserError(f"cannot read {_title(name)} file {path}: {exc}. It must be the python version's pickled "
                        f"file ({f['folder']}/, with '{f['label_key']}'); replace the file") from None
    if len(data) != len(labels) or (len(labels) and not (0 <= labels.min() and labels.max() <= top)):
        raise UserError(f"{_title(name)} file {path}: {len(data)} images but {len(labels)} labels in 0..{top}; replace "
                        f"the file")
    published = hashlib.md5(raw).hexdigest() == f["md5"].get(path.name)  # noqa: S324 - the published md5
    return data, labels, published


def _pickles(name: str, root: Path, split: str) -> Optional[Tuple[np.ndarray, np.ndarray, Dict[str, Any]]]:
    f = facts(name)
    folder = root / f["folder"] if (root / f["folder"]).is_dir() else root
    names = [f["test_batch"]] if split == "test" else list(f["train_batches"])
    if not any((folder / n).is_file() for n in names):
        return None
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise UserError(f"{name}: {folder} lacks {', '.join(missing)} of the {split} split; restore them")
    parts = [_batch(name, folder / n) for n in names]
    prov = {"layout": "pickled batches", "files": names, "published_md5": all(p[2] for p in parts)}
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), prov


def _folder(name: str, root: Path, split: str) -> Tuple[List[Tuple[int, Path, int]], Dict[str, Any]]:
    base = root / split if (root / split).is_dir() else root
    fa = facts(name)
    classes = list(fa["classes"])
    dirs = sorted(d for d in base.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not dirs:
        raise UserError(f"{name}: {root} holds neither the pickled files ({fa['folder']}/{fa['test_batch']}) nor "
                        f"class folders ({split}/<class>/<index>.png); point --data-root at your copy")
    items, seen = [], {}
    for d in dirs:
        if d.name not in classes:
            listed = ", ".join(classes) if len(classes) <= 10 else f"{', '.join(classes[:3])}, ... ({len(classes)})"
            raise UserError(f"{name}: folder {d} is no {_title(name)} class ({listed}); remove it")
        for f in sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith(".")):
            m = _INDEX.search(f.stem)
            if m is None:
                raise UserError(f"{name}: {f} has no index at the end of its name, so its place in the {split} set "
                                f"is unknown; name files <name><index>.png (e.g. 42.png) or use the pickled files")
            i = int(m.group(1))
            if i in seen:
                raise UserError(f"{name}: index {i} is taken by both {seen[i]} and {f}; each image's index must be "
                                f"its own")
            seen[i] = f
            items.append((i, f, classes.index(d.name)))
    items.sort()
    return items, {"layout": "image folder", "index_rule": "the number ending each file name"}


class Cifar(Dataset):
    """CIFAR-10 or CIFAR-100 (``name``), one split, in the published order."""

    def __init__(self, name: str, split: str, root: Path) -> None:
        self.name = name
        got = _pickles(name, root, split)
        self.paths: Optional[List[Path]] = None
        if got is not None:
            self.images, labels, prov = got
            positions = list(range(len(labels)))
        else:
            items, prov = _folder(name, root, split)
            positions = [i for i, _, _ in items]
            self.paths = [p for _, p, _ in items]
            labels = np.asarray([c for _, _, c in items], dtype=np.int64)
        self.labels = labels
        self.sample_ids: List[str] = [f"{split}/{i}" for i in positions]
        full = 10000 if split == "test" else 50000
        self.info = datasets.get(name)
        self.provenance = {"dataset": name, "split": split, "root": str(root), "n": len(labels),
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
                raise UserError(f"{self.name}: {self.paths[i]} is {arr.shape[1]}x{arr.shape[0]}, not 32x32; replace it")
            x = torch.from_numpy(arr.transpose(2, 0, 1).astype(np.float32) / 255.0)
        return x, int(self.labels[i])


def _factory_of(name: str) -> Callable[[str, Optional[str], Dict[str, Any]], Cifar]:
    def factory(split: str, root: Optional[str], model_info: Dict[str, Any]) -> Cifar:
        """No options: the leaderboard's sample set is the whole split in order (``--limit N`` takes its first N)."""
        if not root or not Path(root).expanduser().is_dir():
            raise UserError(f"{name}: data root {root} is not a folder; pass --data-root DIR holding "
                            f"{facts(name)['folder']}/ (or <split>/<class>/<index>.png)")
        return Cifar(name, split, Path(root).expanduser())
    return factory


for _name, _folder_name in (("cifar10", "cifar-10-batches-py"), ("cifar100", "cifar-100-python")):
    datasets.add(_name, DatasetInfo(
        _name, _name, 10 if _name == "cifar10" else 100,
        f"{_title(_name)} (10,000 test / 50,000 train) in the published order: {_folder_name}/ or "
        f"<split>/<class>/<index>.png", splits=("test", "train"), needs_root=True, factory=_factory_of(_name)))
