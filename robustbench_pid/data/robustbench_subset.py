"""RobustBench's ImageNet sample set (``--suite robustbench`` on ``imagenet``): the 5,000 validation images its
leaderboard runs, by its own id list (``core/robustbench.py``: a verbatim copy with its source commit and sha256),
in the list's order, each labelled by its class folder's index in the 1,000 sorted wnids (RobustBench labels by the
sorted class folders of its ``val/``; with all 1,000 present the two agree).

Every listed image must be under ``--data-root``: a missing one is refused, naming how many and the first few,
never skipped (a leaderboard number on 4,990 images is not the leaderboard's number).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Tuple

from ..core import robustbench as rb
from ..core.imagenet_info import wnid_to_index
from ..errors import UserError

LISTS = ("robustbench",)  # the sample lists the imagenet dataset knows (its option ``sample_list``)


def listed_items(root: Path, name: str) -> Tuple[List[Tuple[Path, int, str]], Dict[str, Any]]:
    """The listed images under ``root`` as (path, label, sample id) in list order, and their provenance (plain
    tuples: the imagenet dataset, which imports this module, makes its items of them)."""
    if name not in LISTS:
        raise UserError(f"imagenet: unknown sample list {name!r}; known: {', '.join(LISTS)}")
    ids = rb.imagenet_subset()
    w2i = wnid_to_index()
    missing = [i for i in ids if not (root / i).is_file()]
    if missing:
        raise UserError(f"imagenet: {len(missing):,} of the {len(ids):,} images of RobustBench's ImageNet subset are "
                        f"missing from {root}, e.g. {', '.join(missing[:3])}; point --data-root at a complete copy of "
                        f"the ImageNet validation set (its val/<wnid>/*.JPEG holds all of them)")
    items = [(root / i, w2i[i.split("/")[0]], i) for i in ids]
    info = rb.facts()["imagenet_subset"]
    return items, {"sample_list": {"name": name, "source": f"{rb.source()}: {info['copied_from']}",
                                   "sha256": info["sha256"], "n": len(ids), "order": "the list's"}}
