"""The embedded default: scikit-learn's ``load_digits`` (1,797 real 8x8 handwritten digits).

Pixels 0..16 are scaled to [0, 1], repeated to 3 channels and resized to 32x32 (bilinear,
``align_corners=False``) to fit the digits models. Split: stratified 80/20 with
``sklearn.model_selection.train_test_split(test_size=0.2, stratify=y, random_state=0)``,
giving 1,437 train and 360 test images. Sample ids are the row indices in ``load_digits``.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from . import DatasetInfo, datasets

SIZE = 32
SPLIT_SEED = 0
TEST_FRACTION = 0.2


@lru_cache(maxsize=1)
def _arrays() -> Tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images.astype(np.float32) / 16.0, d.target.astype(np.int64)


@lru_cache(maxsize=1)
def split_indices() -> Dict[str, np.ndarray]:
    """The fixed, stratified train/test split (row indices into ``load_digits``)."""
    from sklearn.model_selection import train_test_split

    _, y = _arrays()
    idx = np.arange(len(y))
    train, test = train_test_split(idx, test_size=TEST_FRACTION, stratify=y, random_state=SPLIT_SEED)
    return {"train": np.asarray(train), "test": np.asarray(test)}


class Digits(Dataset):
    def __init__(self, split: str = "test", size: int = SIZE) -> None:
        images, labels = _arrays()
        rows = split_indices()[split]
        x = torch.from_numpy(images[rows]).unsqueeze(1)  # N,1,8,8
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).clamp_(0, 1)
        self.images = x.repeat(1, 3, 1, 1).contiguous()
        self.labels = torch.from_numpy(labels[rows])
        self.sample_ids: List[str] = [str(int(r)) for r in rows]
        self.split = split
        self.info = datasets.get("digits")
        self.provenance = {"dataset": "digits", "split": split, "split_seed": SPLIT_SEED,
                           "test_fraction": TEST_FRACTION, "size": size, "n": len(rows)}

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        return self.images[i], int(self.labels[i])


def _factory(split: str, root: Optional[str], model_info: Dict[str, Any]) -> Digits:
    """No options: 360 test images need no subset (``--limit N``), and arrays in memory cannot be
    unreadable; ``load_dataset`` refuses both flags."""
    return Digits(split, size=int(model_info.get("input_size", (3, SIZE, SIZE))[-1]))


datasets.add("digits", DatasetInfo(
    "digits", "digits", 10,
    "scikit-learn load_digits, 32x32x3 in [0,1], stratified 80/20 split (seed 0): 1437 train / 360 test",
    splits=("test", "train"), factory=_factory,
))
