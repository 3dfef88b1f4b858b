"""A small convolutional network for the embedded digits, registered with timm: the zoo's non-attention model.

Why a CNN in a zoo of vision transformers: the adversarially trained MNIST CNNs (Madry et al. 2018's MNIST model,
TRADES' SmallCNN) are where AutoAttack's gradient-free member matters. Trained with PGD at a large eps, such a
network can mask its gradients (flat ReLU regions around the data, saturated first-layer features), so PGD and
even APGD overestimate its robustness and the query-based Square attack breaks samples the gradient attacks leave
(Croce & Hein 2020, the MNIST rows of their tables). The adversarially trained transformers of the zoo
(``deit_at``, ``pid_deit_at``) never needed Square; ``cnn_at`` is the embedded model trained MNIST-style.

Layout, in the spirit of those MNIST CNNs at the digits' 32x32: three blocks of 3x3 convolution (padding 1) + ReLU +
2x2 max-pooling (widths 32, 64, 64; 32 -> 16 -> 8 -> 4 pixels), then a fully connected ReLU layer of 128 and the
10-way classifier: 0.19M parameters (the transformers of the zoo have 0.13M to 0.25M). The network takes the
normalized image like every timm model here; ``load_model`` wraps it in
:class:`~robustbench_pid.models.wrapper.Normalized`, so the zoo model takes [0, 1] images of the digits' shape
(3 x 32 x 32), like the others.
"""
from __future__ import annotations

from typing import Any, Dict, Sequence

import torch
from timm.models import generate_default_cfgs, register_model
from timm.models._builder import build_model_with_cfg
from torch import nn

from .configs import DIGITS_CFG

CNN_DIGITS_CFG: Dict[str, Any] = dict(DIGITS_CFG, first_conv="features.0", classifier="head")
CNN_DIGITS: Dict[str, Any] = dict(img_size=32, channels=(32, 64, 64), hidden=128, num_classes=10)


class SteppedReLU(nn.Module):
    """ReLU rounded to multiples of ``1 / steps``, passing ReLU's gradient straight through the rounding.

    Why it exists: a network whose gradients really mislead, for the held-out set of the stop rule. Its output is a
    staircase, so the input gradient autograd returns (ReLU's, the straight-through estimate training used) points
    where the function does not go, while a query-based search sees the steps (Athalye et al. 2018 on shattered
    gradients; Galloway et al. 2018 on quantized activations)."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps {steps!r} must be a positive integer (0 in SmallCNN means plain ReLU)")
        self.steps = steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = torch.relu(x)
        return r + (torch.round(r * self.steps) / self.steps - r).detach()

    def extra_repr(self) -> str:
        return f"steps={self.steps}"


class SmallCNN(nn.Module):
    """``len(channels)`` blocks of conv 3x3 + ReLU + max-pool 2, then ``hidden`` ReLU units and the classifier
    (``steps`` > 0: every ReLU is a :class:`SteppedReLU`)."""

    def __init__(self, img_size: int = 32, in_chans: int = 3, num_classes: int = 10,
                 channels: Sequence[int] = (32, 64, 64), hidden: int = 128, steps: int = 0) -> None:
        super().__init__()
        channels = [int(c) for c in channels]
        if not channels or any(c < 1 for c in channels) or hidden < 1:
            raise ValueError(f"channels {channels} and hidden {hidden} must be positive")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"steps {steps!r} must be a whole number >= 0 (0: plain ReLU)")
        act = (lambda: SteppedReLU(steps)) if steps else nn.ReLU
        side = int(img_size) >> len(channels)
        if side < 1 or int(img_size) % (1 << len(channels)):
            raise ValueError(f"img_size {img_size} does not halve {len(channels)} times into whole pixels")
        layers = []
        for cin, cout in zip([in_chans, *channels[:-1]], channels):
            layers += [nn.Conv2d(cin, cout, 3, padding=1), act(), nn.MaxPool2d(2)]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(channels[-1] * side * side, hidden)
        self.head = nn.Linear(hidden, num_classes)
        self.act = act()
        self.num_classes, self.img_size, self.in_chans = num_classes, int(img_size), in_chans
        self.channels, self.hidden = tuple(channels), int(hidden)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x).flatten(1)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.act(self.fc(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Any = None) -> None:
        self.num_classes = num_classes
        self.head = nn.Linear(self.hidden, num_classes)


default_cfgs = generate_default_cfgs({"cnn_digits_32": CNN_DIGITS_CFG})


@register_model
def cnn_digits_32(pretrained: bool = False, **kwargs: Any) -> SmallCNN:
    """Small CNN at the embedded digits size (32x32; conv 32-64-64 with max-pooling, fc 128)."""
    return build_model_with_cfg(SmallCNN, "cnn_digits_32", pretrained, **dict(CNN_DIGITS, **kwargs))


# --- zoo aliases -------------------------------------------------------------------------------
from .zoo import ModelEntry, zoo  # noqa: E402  (after the timm registration above)

# Only the adversarially trained member: a plain CNN would back no claim and no grid cell (what the CNN is for, a
# converged evaluation against AutoAttack on a model trained to resist at a large eps, needs the trained one).
# Digits only: no ImageNet CNN is part of what this harness compares.
zoo.add("cnn_at", ModelEntry(
    "cnn_at", "small CNN (conv 32-64-64, fc 128), PGD adversarially trained (digits: 48/255)",
    archs={"digits": "cnn_digits_32"},
    default_checkpoints={"digits": "embedded:cnn_at_digits"},
))
