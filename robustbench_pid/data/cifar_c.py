"""CIFAR-10-C and CIFAR-100-C as RobustBench scores them: the released arrays, not generated corruptions.

Layout under ``--data-root DIR`` (RobustBench's ``data_dir``): ``CIFAR-10-C/`` (or ``CIFAR-100-C/``) holding
``labels.npy`` and one ``<corruption>.npy`` per corruption, 50,000 x 32 x 32 x 3 uint8 (5 severities x 10,000 rows,
NHWC); beside it the clean test set RobustBench's clean accuracy reads (``cifar-10-batches-py/`` or
``cifar-100-python/``, ``data/cifar.py``). Read as RobustBench's ``load_corruptions_cifar`` reads them: severity s
is rows ``(s-1)*10000 .. s*10000``, the first n of those in order, labels ``labels.npy[:n]``, pixels / 255.

Only RobustBench's 15 corruptions are scored, in its order; the archives' 4 extra files (speckle_noise,
gaussian_blur, spatter, saturate) are ignored. A missing, damaged or truncated file among the 15, or a label out of
range, is one error naming it before anything is scored (``released_arrays``). Samples: the clean images first
(``clean``), then each corruption x severity (``<corruption>/<severity>``), n each; sample ids
``<condition>/test/<index>``, so the same test image pairs across conditions.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from ..core import robustbench as rb
from ..core.imagenet_info import CORRUPTIONS_EXTRA, SEVERITIES
from ..errors import UserError
from . import DatasetInfo, datasets
from .imagenet_c import _Lazy  # a sequence computed per index (76 conditions x 10,000 samples)
from .released_arrays import ReleasedArray, open_array

ROWS = 10_000  # rows per severity, as RobustBench hard-codes it
SHAPE = (len(SEVERITIES) * ROWS, 32, 32, 3)
FOLDERS = {"cifar10": "CIFAR-10-C", "cifar100-c": "CIFAR-100-C", "cifar10-c": "CIFAR-10-C", "cifar100": "CIFAR-100-C"}
ZENODO = {"cifar10": "2535967", "cifar100": "3555552"}


def _fix(base: str) -> str:
    return (f"re-download {FOLDERS[base]}.tar (Zenodo record {ZENODO[base]}) and extract it into --data-root, as "
            f"RobustBench's data_dir holds it")


def check_release(base: str, folder: Path) -> Tuple[Dict[str, ReleasedArray], np.ndarray, List[str]]:
    """The 15 scored arrays (corruption -> file), the labels, and the files ignored; one error for the first
    problem, naming the file."""
    what, fix = FOLDERS[base], _fix(base)
    if not folder.is_dir():
        raise UserError(f"{what}: no folder {folder}; --data-root must hold {what}/ (labels.npy and one "
                        f"<corruption>.npy per corruption), as RobustBench's data_dir does")
    order = rb.corruption_order()
    missing = [c for c in order if not (folder / f"{c}.npy").is_file()]
    if missing:
        raise UserError(f"{what}: {len(missing)} of RobustBench's 15 corruption files missing from {folder}: "
                        f"{', '.join(m + '.npy' for m in missing)}; {fix}")
    labels_file = open_array(folder / "labels.npy", what, fix, SHAPE[:1], "iu")
    labels = labels_file.rows(0, SHAPE[0]).astype(np.int64)
    classes = 10 if base == "cifar10" else 100
    bad = np.flatnonzero((labels < 0) | (labels >= classes))
    if bad.size:
        raise UserError(f"{what}: {labels_file.path} has label {int(labels[bad[0]])} at row {int(bad[0])} "
                        f"({bad.size:,} rows out of 0..{classes - 1}): not {what}'s labels; {fix}")
    arrays = {c: open_array(folder / f"{c}.npy", what, fix, SHAPE, "u") for c in order}
    known = set(order) | set(CORRUPTIONS_EXTRA) | {"labels"}
    ignored = sorted(p.name for p in folder.glob("*.npy") if p.stem not in known or p.stem in CORRUPTIONS_EXTRA)
    return arrays, labels, ignored


class CifarC(Dataset):
    """The clean test images (optional) and 15 x 5 released cells of ``n`` images each, condition-contiguous."""

    def __init__(self, name: str, root: Path, n: int, clean: bool) -> None:
        base = rb.board_dataset(name)
        self.base = base
        self.folder = root / FOLDERS[base]
        self.arrays, all_labels, ignored = check_release(base, self.folder)
        self.n = n
        self.cell_labels = all_labels[:n]  # RobustBench: labels[:n] for every severity
        self.conds: List[str] = (["clean"] if clean else []) + [f"{c}/{s}" for c in self.arrays for s in SEVERITIES]
        self.clean_images: Optional[np.ndarray] = None
        clean_prov: Dict[str, Any] = {}
        if clean:
            from .cifar import Cifar

            ref = Cifar(base, "test", root)
            if ref.paths is not None or len(ref) < n:
                raise UserError(f"{FOLDERS[base]}'s clean accuracy reads the pickled test file beside it "
                                f"({rb.cifar(base)['folder']}/{rb.cifar(base)['test_batch']} under {root}, "
                                f"{len(ref):,} images found, {n:,} needed); put the published file there as "
                                f"RobustBench's data_dir holds it")
            self.clean_images, self.clean_labels = ref.images[:n], np.asarray(ref.labels[:n], dtype=np.int64)
            f = rb.cifar(base)
            st = next(p for p in (root / f["folder"] / f["test_batch"], root / f["test_batch"]) if p.is_file()).stat()
            self.clean_file = (f["test_batch"], int(st.st_size), int(st.st_mtime_ns))
            clean_prov = {k: ref.provenance[k] for k in ("layout", "files", "published_md5") if k in ref.provenance}
        self.info = datasets.get(name)
        total = len(self.conds) * n
        self.sample_ids = _Lazy(total, lambda i: f"{self.conds[i // n]}/test/{i % n}")
        self.conditions = _Lazy(total, lambda i: self.conds[i // n])
        self.labels = _Lazy(total, self._label)
        self.provenance = {
            "dataset": name, "root": str(root), "folder": str(self.folder), "n": total, "n_per_condition": n,
            "conditions": len(self.conds), "corruptions": list(self.arrays), "severities": list(SEVERITIES),
            "rows": f"severity s: rows (s-1)*{ROWS} + [0, {n}) of <corruption>.npy; labels.npy[:{n}]",
            "files": {c: a.identity() for c, a in self.arrays.items()}, "ignored_files": ignored,
            "file_identity": "size and mtime_ns (data/released_arrays.py says why not a sha256)",
            "clean": clean_prov or None, "transform": {"to_tensor": True, "normalize": "inside the model"}}

    def __len__(self) -> int:
        return len(self.conds) * self.n

    def _label(self, i: int) -> int:
        j = i % self.n
        return int(self.clean_labels[j] if self.conds[i // self.n] == "clean" else self.cell_labels[j])

    def where(self, i: int) -> Tuple[str, int, int]:
        """(condition, image index j, row in its file) of sample i."""
        cond, j = self.conds[i // self.n], i % self.n
        if cond == "clean":
            return cond, j, j
        return cond, j, (int(cond.rsplit("/", 1)[1]) - 1) * ROWS + j

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: Sequence[int]) -> List[Tuple[torch.Tensor, int]]:
        """A batch read in runs of consecutive rows of one file (one memory map each), converted once."""
        parts: List[np.ndarray] = []
        k = 0
        while k < len(indices):
            cond, _, row = self.where(int(indices[k]))
            m = k + 1
            while m < len(indices) and self.where(int(indices[m]))[0] == cond and \
                    self.where(int(indices[m]))[2] == row + (m - k):
                m += 1
            if cond == "clean":
                parts.append(self.clean_images[row:row + (m - k)].transpose(0, 2, 3, 1))  # stored NCHW
            else:
                parts.append(self.arrays[cond.rsplit("/", 1)[0]].rows(row, row + (m - k)))
            k = m
        x = torch.from_numpy(np.concatenate(parts)).permute(0, 3, 1, 2).float().div_(255.0)
        return [(x[t], self._label(int(i))) for t, i in enumerate(indices)]

    def record_columns(self, sample_ids: Sequence[str]) -> Dict[str, List[Any]]:
        """What each record says of its image's source: the row in its file and the file's identity."""
        rows, files, sizes, mtimes = [], [], [], []
        for sid in sample_ids:
            cond, _, j = sid.rpartition("/test/")
            if cond == "clean":
                rows.append(int(j))
                files.append(self.clean_file[0])
                sizes.append(self.clean_file[1])
                mtimes.append(self.clean_file[2])
                continue
            c, s = cond.rsplit("/", 1)
            a = self.arrays[c]
            rows.append((int(s) - 1) * ROWS + int(j))
            files.append(a.path.name)
            sizes.append(a.size)
            mtimes.append(a.mtime_ns)
        return {"row": rows, "file": files, "file_size": sizes, "file_mtime_ns": mtimes}


def _factory_of(name: str) -> Any:
    def factory(split: str, root: Optional[str], model_info: Dict[str, Any], n_per_cell: Optional[int] = None,
                clean: bool = True) -> CifarC:
        """``n_per_cell``: the first n of each cell (RobustBench's n_examples; ``--limit`` under --suite
        robustbench-corruptions), default all 10,000; ``clean``: score the clean test images too."""
        if n_per_cell is not None and (isinstance(n_per_cell, bool) or not isinstance(n_per_cell, int)
                                       or not 1 <= n_per_cell <= ROWS):
            raise UserError(f"{name}: the images per cell (--limit under --suite robustbench-corruptions) must be a "
                            f"whole number 1..{ROWS:,}, got {n_per_cell!r}")
        if not isinstance(clean, bool):
            raise UserError(f"{name}: clean must be True or False, got {clean!r}")
        if not root or not Path(root).expanduser().is_dir():
            raise UserError(f"{name}: data root {root} is not a folder; pass --data-root DIR holding "
                            f"{FOLDERS[name]}/ (RobustBench's data_dir)")
        return CifarC(name, Path(root).expanduser(), n_per_cell or ROWS, clean)
    return factory


for _name in ("cifar10-c", "cifar100-c"):
    datasets.add(_name, DatasetInfo(
        _name, rb.board_dataset(_name), 10 if _name == "cifar10-c" else 100,
        f"{FOLDERS[_name]}, the released arrays as RobustBench scores them: <data-root>/{FOLDERS[_name]}/"
        f"<corruption>.npy + labels.npy, 15 corruptions x 5 severities x 10,000 (plus the clean test set)",
        splits=("test",), needs_root=True, default_benchmark="robustbench_corruptions", samples="corrupted",
        factory=_factory_of(_name)))
