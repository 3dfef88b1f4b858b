"""Timing helpers of the benchmark scripts: the package's own (``robustbench_pid.run.speed``), which
``robustbench-pid doctor`` runs too, so a benchmark and doctor never measure with two copies.

Ratios are measured side by side in one process: the candidates run interleaved (A B A B ...)
after a warm-up, and each figure is the median over repetitions, so a noisy shared machine
shifts both sides of a ratio alike.
"""
from __future__ import annotations

import torch

from robustbench_pid.run.speed import forward, forward_backward, machine, sync, timed_interleaved  # noqa: F401


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
