"""Timing helpers shared by the benchmark scripts (not part of the package).

Ratios are measured side by side in one process: the candidates run interleaved (A B A B ...)
after a warm-up, and each figure is the median over repetitions, so a noisy shared machine
shifts both sides of a ratio alike.
"""
from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from typing import Callable, Dict, List

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_interleaved(fns: Dict[str, Callable[[], object]], device: torch.device, reps: int = 5,
                      warmup: int = 1) -> Dict[str, float]:
    """Median seconds per call of each function, calls interleaved round-robin."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
            sync(device)
    times: Dict[str, List[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            sync(device)
            t = time.perf_counter()
            fn()
            sync(device)
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def forward_backward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str = "fp32") -> None:
    """One attack step's cost: forward, summed cross-entropy, gradient to the input only (the
    parameters frozen or not, their gradients are not taken), under the runner's autocast."""
    from robustbench_pid.device import attack_precision

    xr = x.detach().clone().requires_grad_(True)
    with attack_precision(x.device, precision):
        loss = torch.nn.functional.cross_entropy(model(xr).float(), y, reduction="sum")
    torch.autograd.grad(loss, xr)


def machine() -> str:
    """One line describing where the figures were measured."""
    if torch.cuda.is_available():
        dev = f"GPU {torch.cuda.get_device_name(0)}"
    else:
        try:
            out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
            model = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "?")
        except Exception:  # noqa: BLE001
            model = platform.processor() or "?"
        dev = f"CPU {model}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{dev}; torch {torch.__version__}; load average {load:.1f}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
