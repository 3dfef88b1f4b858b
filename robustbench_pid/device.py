"""Device selection and mixed precision.

On CUDA, ``precision="bf16"`` runs the attack's forward/backward under bf16 autocast (fused
attention kernels, ~2x throughput); the verdict (clean and adversarial predictions that are
scored) is always computed in fp32, so a bf16 attack can only make the attack weaker, never
the scoring wrong. fp32 (default) is the reference.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from .errors import UserError


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available on this machine; use --device cpu or auto")
    try:
        return torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None


@contextlib.contextmanager
def attack_precision(device: torch.device, precision: str) -> Iterator[None]:
    if precision == "fp32":
        yield
        return
    if precision not in ("bf16", "fp16"):
        raise UserError(f"unknown precision {precision!r}; use fp32, bf16 or fp16")
    if device.type != "cuda":
        raise UserError(f"--precision {precision} needs a CUDA device; on CPU use fp32")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    with torch.autocast("cuda", dtype=dtype):
        yield
