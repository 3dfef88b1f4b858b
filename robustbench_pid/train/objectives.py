"""The training loss of one batch, per adversarial-training method (``Adversarial.method`` in recipes.py).

Why here and not in the loop: the loop (schedule, augmentation, seeding) is the same for every method, and a
method is its points and its loss. ``pgd`` is the zoo's (Madry et al. 2018) and draws exactly what it drew before
the other methods existed, so the shipped checkpoints still retrain bit for bit. The others are the held-out
set's (issue 63), each after its paper: TRADES (Zhang et al. 2019), MART (Wang et al. 2020), fast FGSM (Wong et
al. 2020) and free AT (Shafahi et al. 2019). All points are drawn from the run's seeded generator.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .adversarial import adversarial_batch
from .recipes import Adversarial

Model = Callable[[torch.Tensor], torch.Tensor]  # takes [0, 1] images


def kl_rows(logits_clean: torch.Tensor, logits_adv: torch.Tensor) -> torch.Tensor:
    """Per row: KL(softmax(clean) || softmax(adv)), summed over classes (TRADES' and MART's divergence)."""
    return F.kl_div(F.log_softmax(logits_adv, 1), F.log_softmax(logits_clean, 1), reduction="none",
                    log_target=True).sum(1)


def trades_loss(logits_clean: torch.Tensor, logits_adv: torch.Tensor, y: torch.Tensor, beta: float,
                label_smoothing: float = 0.0) -> torch.Tensor:
    """CE on the clean point plus ``beta`` times the batch mean of the KL from the clean to the adversarial output."""
    return (F.cross_entropy(logits_clean, y, label_smoothing=label_smoothing)
            + beta * kl_rows(logits_clean, logits_adv).mean())


def mart_loss(logits_clean: torch.Tensor, logits_adv: torch.Tensor, y: torch.Tensor, beta: float) -> torch.Tensor:
    """Boosted CE on the adversarial point (-log p_y - log(1 - the largest other p)) plus ``beta`` times the KL,
    each row weighted by 1 - p_y at the clean point: misclassified clean samples weigh most."""
    p_adv = F.softmax(logits_adv, 1)
    other = p_adv.scatter(1, y[:, None], 0.0).amax(1)
    boosted = F.cross_entropy(logits_adv, y) - torch.log(torch.clamp(1.0 - other, min=1e-12)).mean()
    weight = 1.0 - F.softmax(logits_clean, 1).gather(1, y[:, None]).squeeze(1)
    return boosted + beta * (kl_rows(logits_clean, logits_adv) * weight).mean()


def trades_points(model: Model, x: torch.Tensor, eps: float, adv: Adversarial,
                  generator: torch.Generator) -> torch.Tensor:
    """TRADES' inner maximisation: from x + 0.001 N(0, 1), sign steps up the KL to the clean output, projected."""
    with torch.no_grad():
        clean = model(x)
    x_adv = (x + 0.001 * torch.randn(x.shape, generator=generator)).clamp(0, 1)
    for _ in range(adv.steps):
        x_adv.requires_grad_(True)
        with torch.enable_grad():
            (g,) = torch.autograd.grad(kl_rows(clean, model(x_adv)).sum(), x_adv)
        x_adv = torch.min(torch.max(x_adv.detach() + adv.step_size * g.sign(), x - eps), x + eps).clamp(0, 1)
    return x_adv.detach()


def fast_points(model: Model, x: torch.Tensor, y: torch.Tensor, eps: float, adv: Adversarial,
                generator: torch.Generator) -> torch.Tensor:
    """Fast FGSM: a uniform start in the eps ball, one signed CE step of ``step_size``, projected."""
    delta = (torch.rand(x.shape, generator=generator) * 2 - 1) * eps
    x0 = (x + delta).clamp(0, 1).requires_grad_(True)
    with torch.enable_grad():
        (g,) = torch.autograd.grad(F.cross_entropy(model(x0), y), x0)
    return torch.min(torch.max(x0.detach() + adv.step_size * g.sign(), x - eps), x + eps).clamp(0, 1)


class FreeDelta:
    """Free AT's perturbation, kept across batches and replays: each replay's backward pass gives the weights'
    gradient and the perturbation's, and the perturbation takes a sign step of ``step_size`` (clipped to eps)."""

    def __init__(self) -> None:
        self.delta: Optional[torch.Tensor] = None
        self.live: Optional[torch.Tensor] = None

    def point(self, x: torch.Tensor) -> torch.Tensor:
        if self.delta is None or self.delta.shape[1:] != x.shape[1:] or len(self.delta) < len(x):
            self.delta = torch.zeros_like(x)
        self.live = self.delta[:len(x)].clone().requires_grad_(True)
        return (x + self.live).clamp(0, 1)

    def step(self, adv: Adversarial, eps: float) -> None:
        """After the backward pass: the sign step on the part of the perturbation this batch used."""
        assert self.live is not None and self.live.grad is not None
        new = (self.live.detach() + adv.step_size * self.live.grad.sign()).clamp(-eps, eps)
        self.delta[:len(new)] = new
        self.live = None


def batch_loss(net: torch.nn.Module, pixels: Model, xb: torch.Tensor, yb: torch.Tensor, adv: Optional[Adversarial],
               epoch: int, generator: torch.Generator, label_smoothing: float,
               free: Optional[FreeDelta] = None) -> torch.Tensor:
    """The loss of one batch: ``net`` takes normalized images, ``pixels`` is it behind the normalisation ([0, 1]
    images). Without ``adv``: CE on the batch. The attacks run with the network in eval mode, as the PGD one does."""
    if adv is None:
        return F.cross_entropy(pixels(xb), yb, label_smoothing=label_smoothing)
    eps = adv.eps_at(epoch)
    if adv.method == "pgd":
        return F.cross_entropy(pixels(adversarial_batch(pixels, xb, yb, adv, epoch, generator)), yb,
                               label_smoothing=label_smoothing)
    if adv.method == "free":
        assert free is not None, "free AT keeps its perturbation in a FreeDelta"
        return F.cross_entropy(pixels(free.point(xb)), yb, label_smoothing=label_smoothing)
    was_training = net.training
    net.eval()
    try:
        if adv.method == "trades":
            x_adv = trades_points(pixels, xb, eps, adv, generator)
        elif adv.method == "mart":
            x_adv = adversarial_batch(pixels, xb, yb, adv, epoch, generator)
        else:
            x_adv = fast_points(pixels, xb, yb, eps, adv, generator)
    finally:
        net.train(was_training)
    if adv.method == "fast":
        return F.cross_entropy(pixels(x_adv), yb, label_smoothing=label_smoothing)
    if adv.method == "trades":
        return trades_loss(pixels(xb), pixels(x_adv), yb, adv.beta, label_smoothing)
    return mart_loss(pixels(xb), pixels(x_adv), yb, adv.beta)
