"""ImageNet class lists, the 200-class masks of ImageNet-A/-R/-O, and the ImageNet-C constants.

The 1000 sorted wnids and the A/R lists are read at run time from the files timm ships
(``timm/data/_info``), which are byte-identical to the lists published with the datasets; timm has
no ImageNet-O list, so the project keeps its own copy in ``robustbench_pid/core/_data/imagenet_o_wnids.txt``.
Tests check every list against the sha256 values recorded in the shared reference facts.

Constants (AlexNet errors, corruption order) are from hendrycks/robustness @8190fe32
(ImageNet-C README / test scripts): they are facts, not code.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Dict, List, Tuple

# The 15 corruptions that enter mCE, in the standard order.
CORRUPTIONS_15: Tuple[str, ...] = (
    "gaussian_noise", "shot_noise", "impulse_noise",
    "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
    "snow", "frost", "fog",
    "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression",
)
# Held-out corruptions (no AlexNet baseline): reported separately, never in mCE.
CORRUPTIONS_EXTRA: Tuple[str, ...] = ("speckle_noise", "gaussian_blur", "spatter", "saturate")
SEVERITIES: Tuple[int, ...] = (1, 2, 3, 4, 5)

# AlexNet top-1 error per corruption, averaged over the 5 severities (the CE denominators).
ALEXNET_MEAN_ERR: Dict[str, float] = {
    "gaussian_noise": 0.886428, "shot_noise": 0.894468, "impulse_noise": 0.92264,
    "defocus_blur": 0.81988, "glass_blur": 0.826268, "motion_blur": 0.785948, "zoom_blur": 0.79836,
    "snow": 0.866816, "frost": 0.826572, "fog": 0.819324,
    "brightness": 0.564592, "contrast": 0.853204, "elastic_transform": 0.646056,
    "pixelate": 0.71784, "jpeg_compression": 0.6065,
}
ALEXNET_CLEAN_ERR: float = 0.4348

# The category folders some ImageNet-C copies insert above the corruption folders.
IMAGENET_C_CATEGORIES: Tuple[str, ...] = ("noise", "blur", "weather", "digital", "extra")

# Images in each published set (ImageNet-C: per corruption and severity; ImageNet-O: its OOD images, the
# in-distribution half being the 10,000 val images of its 200 wnids), the sizes a full benchmark run reads.
PUBLISHED_COUNTS: Dict[str, int] = {"imagenet": 50000, "imagenet-a": 7500, "imagenet-r": 30000, "imagenet-o": 2000,
                                    "imagenet-o-in": 10000, "imagenet-v2": 10000, "imagenet-sketch": 50889,
                                    "imagenet-c": 50000}

# Chance AUPR of the ImageNet-O protocol: 2,000 OOD positives vs 10,000 in-distribution images.
IMAGENET_O_CHANCE_AUPR: float = 100.0 * 2000 / 12000


def _timm_info_dir() -> Path:
    import timm.data

    return Path(timm.data.__file__).parent / "_info"


def _read_lines(path: Path) -> List[str]:
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip()]


@lru_cache(maxsize=None)
def imagenet_wnids() -> Tuple[str, ...]:
    """The 1000 ImageNet-1k wnids in label order (sorted), from timm's ``imagenet_synsets.txt``."""
    wnids = tuple(_read_lines(_timm_info_dir() / "imagenet_synsets.txt"))
    if len(wnids) != 1000 or list(wnids) != sorted(wnids):
        raise RuntimeError("timm's imagenet_synsets.txt is not the sorted 1000-class list; reinstall timm")
    return wnids


@lru_cache(maxsize=None)
def wnid_to_index() -> Dict[str, int]:
    return {w: i for i, w in enumerate(imagenet_wnids())}


@lru_cache(maxsize=None)
def subset_wnids(name: str) -> Tuple[str, ...]:
    """The 200 wnids of ``name`` in {"a", "r", "o"} (sorted, as published)."""
    name = name.lower().replace("imagenet-", "").replace("imagenet_", "")
    if name in ("a", "r"):
        return tuple(_read_lines(_timm_info_dir() / f"imagenet_{name}_synsets.txt"))
    if name == "o":
        ref = resources.files("robustbench_pid.core") / "_data" / "imagenet_o_wnids.txt"
        return tuple(ln.strip() for ln in ref.read_text().splitlines() if ln.strip())
    raise KeyError(f"no 200-class list for {name!r}; valid: a, r, o")


@lru_cache(maxsize=None)
def subset_indices(name: str) -> Tuple[int, ...]:
    """Indices into the 1000 labels of the 200 classes of ImageNet-A/-R/-O (the logit mask)."""
    w2i = wnid_to_index()
    idx = tuple(w2i[w] for w in subset_wnids(name))
    key = name.lower().replace("imagenet-", "").replace("imagenet_", "")
    if key in ("a", "r"):  # timm also ships the indices: they must agree with the wnids
        shipped = tuple(int(t) for t in _read_lines(_timm_info_dir() / f"imagenet_{key}_indices.txt"))
        if shipped != idx:
            raise RuntimeError(f"timm's imagenet_{key}_indices.txt disagrees with imagenet_{key}_synsets.txt")
    return idx


def list_sha256(items: List[object]) -> str:
    """sha256 of a list written one item a line with a trailing newline (how the reference hashes it)."""
    return hashlib.sha256("".join(f"{x}\n" for x in items).encode()).hexdigest()
