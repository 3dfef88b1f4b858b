"""CIFAR-10-C / CIFAR-100-C files in the released layout, small on disk: every array has the real shape (5 severities
x 10,000 rows, uint8 NHWC, real names, the 4 extra files too) but is sparse, with only the rows a test reads filled
(the first ``n`` of each severity and the ``n`` after them, so a wrong row offset reads other pixels). Beside them the
clean test file RobustBench's data_dir holds."""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Dict

import numpy as np
import torch

from robustbench_pid.core import robustbench as rb
from robustbench_pid.core.imagenet_info import CORRUPTIONS_EXTRA

ROWS = 10_000
ACTIVE = 5  # classes the test labels and TinyNet's predictions use (CIFAR-100 too: accuracies of ~20%, not ~1%)
FOLDER = {"cifar10": "CIFAR-10-C", "cifar100": "CIFAR-100-C"}


def write_release(root: Path, base: str = "cifar10", n: int = 8, seed: int = 0, n_clean: int = 0) -> Path:
    """``root`` as RobustBench's data_dir: ``<FOLDER>/`` (labels.npy + 19 corruption files) and the clean test file.
    The clean file holds ``n_clean`` images (default ``2 n``). Labels are of the first ``ACTIVE`` classes, the ones :class:`TinyNet` predicts, so accuracies are not all 0."""
    rng = np.random.default_rng(seed)
    classes = ACTIVE
    folder = root / FOLDER[base]
    folder.mkdir(parents=True)
    labels = np.tile(rng.integers(0, classes, ROWS).astype(np.uint8), 5)  # the released file repeats them per severity
    np.save(folder / "labels.npy", labels)
    for c in list(rb.corruption_order()) + list(CORRUPTIONS_EXTRA):
        a = np.lib.format.open_memmap(folder / f"{c}.npy", mode="w+", dtype=np.uint8, shape=(5 * ROWS, 32, 32, 3))
        for s in range(5):
            a[s * ROWS:s * ROWS + 2 * n] = rng.integers(0, 256, (2 * n, 32, 32, 3), dtype=np.uint8)
        a.flush()
        del a
    f = rb.cifar(base)
    clean = root / f["folder"]
    clean.mkdir()
    key = "labels" if base == "cifar10" else "fine_labels"
    with open(clean / f["test_batch"], "wb") as fh:
        k = n_clean or 2 * n
        pickle.dump({key: [int(v) for v in labels[:k]], "data": rng.integers(0, 256, (k, 3072), dtype=np.uint8)},
                    fh, protocol=2)
    return root


class TinyNet(torch.nn.Module):
    """A seeded conv net whose predictions vary with the pixels (so accuracies differ per cell)."""

    def __init__(self, classes: int = 10, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.conv = torch.nn.Conv2d(3, 8, 5, stride=2)
        self.fc = torch.nn.Linear(8 * 14 * 14, classes)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
            self.fc.bias[ACTIVE:] = -100.0  # predicts the first ACTIVE classes only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x - 0.5)).flatten(1))


def disk_bytes(folder: Path) -> Dict[str, int]:
    """Allocated bytes per file (st_blocks): what the sparse files really cost."""
    return {p.name: p.stat().st_blocks * 512 for p in folder.iterdir()}
