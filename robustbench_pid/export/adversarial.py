"""``rbp.load_adversarial(run, ...)``: one condition's ``--save-adv`` images of a run as torch tensors.

The files are read and verified on the result side (``results/files/adversarial.py``: torch-free); this only
checks the arguments where they enter and hands the arrays over as tensors.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import torch

from ..errors import UserError


@dataclass
class Adversarial:
    """A condition's final points, in the run's sample order: ``images`` (n, C, H, W) float32 in [0, 1] (for a
    ``--converge`` condition each sample's worst case: the point of the rung that broke it, else the clean image),
    ``labels`` (n,), ``sample_ids``, the condition's identity and the run folder."""

    images: torch.Tensor
    labels: torch.Tensor
    sample_ids: List[str]
    condition: Dict[str, Any]
    run_dir: Path
    stored_u8: int  # how many were stored in 8 bits (losslessly for their verdict); the rest in float32

    def __len__(self) -> int:
        return len(self.sample_ids)


def load_adversarial(run: Union[str, Path], attack: Optional[str] = None, eps: Union[None, float, str] = None,
                     *, settings_id: Optional[str] = None) -> Adversarial:
    """The adversarial images of one condition of a finished ``--save-adv`` run (``attack`` and ``eps``, e.g.
    ``"4/255"``, pick it when the run holds several; ``attack="converge"`` gives the ladder's worst cases)."""
    from ..core.labels import parse_eps
    from ..results.files.adversarial import read_adversarial

    if not isinstance(run, (str, Path)):
        raise UserError(f"load_adversarial: run must be a run folder (str or Path), got {type(run).__name__}")
    for name, value in (("attack", attack), ("settings_id", settings_id)):
        if value is not None and not isinstance(value, str):
            raise UserError(f"load_adversarial: {name} must be text, e.g. 'pgd', got {value!r}")
    if eps is not None:
        if isinstance(eps, bool) or not isinstance(eps, (str, numbers.Real)):
            raise UserError(f"load_adversarial: eps must be a number or text like '4/255', got {eps!r}")
        eps = parse_eps(str(eps))
    got = read_adversarial(run, attack=attack, eps=eps, settings_id=settings_id)
    return Adversarial(images=torch.from_numpy(got.images), labels=torch.from_numpy(got.labels),
                       sample_ids=got.sample_ids, condition=got.condition, run_dir=got.run_dir,
                       stored_u8=got.stored_u8)
