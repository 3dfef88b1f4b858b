"""The training-time attack of PGD adversarial training (Madry et al. 2018): the batch's PGD points.

The harness's own PGD (``attacks/pgd.py``: random start in the ball, sign steps, projection) on the training
network in eval mode, without early stopping (training wants the last iterate, as Madry's recipe), drawing
its random start from the training run's seeded generator, so an adversarial training is as reproducible
as a standard one.
"""
from __future__ import annotations

import torch

from ..attacks import make_attack
from .recipes import Adversarial


def adversarial_batch(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, adv: Adversarial, epoch: int,
                      generator: torch.Generator) -> torch.Tensor:
    """PGD points for the batch (``model`` takes [0, 1] images), at the recipe's eps for ``epoch``."""
    attack = make_attack("pgd", eps=adv.eps_at(epoch), steps=adv.steps, step_size=adv.step_size, early_stop=False)
    was_training = model.training
    model.eval()
    try:
        x_adv = attack(model, x, y, bounds=(0.0, 1.0), generator=generator)
    finally:
        model.train(was_training)
    return x_adv.detach()
