"""Speed measurements shared by ``robustbench-pid doctor`` and the scripts in ``benchmarks/``.

One implementation of each measurement (the benchmark scripts call these, doctor calls these):
images/s of forward and forward+backward-to-the-input passes, the harness's PGD call against bare
passes, the largest batch that fits, the ``--calibration FWD,FB`` pair and the Table 1 estimate it
gives. Ratios are measured side by side in one process: the candidates run interleaved (A B A B
...) after a warm-up and each figure is the median over repetitions, so a noisy shared machine
shifts both sides of a ratio alike.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..runtime.device import attack_precision, find_batch_size

# PIDformer Table 1's attack rows as docs/scaling.md plans them (paper protocol): FGSM and PGD-20 at
# 1..6/255, SPSA, SLD, noise (ImageNet-C/A/R/O not included)
SWEEP_EPS = tuple(f"{i}/255" for i in range(1, 7))
TABLE1_SUITE: List[Tuple[str, Dict[str, Any]]] = \
    [("fgsm", {"eps": e}) for e in SWEEP_EPS] + \
    [("pgd", {"eps": e, "steps": 20, "step_size_factor": 0.15, "random_start": True}) for e in SWEEP_EPS] + [
    ("spsa", {"eps": 0.1, "iterations": 40, "lr": 0.01, "fd_delta": 0.01, "n_samples": 128}),
    ("sld", {"eps": 10.0, "step_size": 1.0, "iterations": 20, "q": 99.0}),
    ("noise", {"eps": 0.3}),
]
TABLE1_IMAGES = 50_000


# --------------------------------------------------------------------------- timing

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_times(fns: Dict[str, Callable[[], object]], device: torch.device, reps: int = 5,
                      warmup: int = 1) -> Dict[str, List[float]]:
    """Every call's seconds for each function, calls interleaved round-robin after ``warmup`` rounds, so
    drifting load on a shared machine hits every candidate alike."""
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
    return times


def timed_interleaved(fns: Dict[str, Callable[[], object]], device: torch.device, reps: int = 5,
                      warmup: int = 1) -> Dict[str, float]:
    """Median seconds per call of each function, calls interleaved round-robin."""
    return {k: statistics.median(v) for k, v in interleaved_times(fns, device, reps, warmup).items()}


def forward(model: torch.nn.Module, x: torch.Tensor, precision: str = "fp32") -> None:
    """A clean or verdict pass: no gradient, under the given autocast."""
    with torch.inference_mode(), attack_precision(x.device, precision):
        model(x)


def forward_backward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str = "fp32") -> None:
    """One attack step's cost: forward, summed cross-entropy, gradient to the input only (the
    parameters frozen or not, their gradients are not taken), under the runner's autocast."""
    xr = x.detach().clone().requires_grad_(True)
    with torch.enable_grad(), attack_precision(x.device, precision):
        loss = torch.nn.functional.cross_entropy(model(xr).float(), y, reduction="sum")
    torch.autograd.grad(loss, xr)


# --------------------------------------------------------------------------- models and inputs

def random_model(arch: str, device: torch.device, seed: int = 0) -> torch.nn.Module:
    """A seeded random-init zoo network (weights do not change the cost) behind its normalization,
    eval mode, parameters frozen: what the harness attacks."""
    from ..models.wrapper import Normalized
    from ..models.zoo import build_model

    torch.manual_seed(seed)
    net = build_model(arch, num_classes=1000)
    cfg = net.pretrained_cfg
    model = Normalized(net, cfg["mean"], cfg["std"]).eval().to(device)
    return model.requires_grad_(False)


def random_batch(batch: int, device: torch.device, size: int = 224, classes: int = 1000,
                 seed: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(batch, 3, size, size, generator=g).to(device)
    y = torch.randint(0, classes, (batch,), generator=g).to(device)
    return x, y


# --------------------------------------------------------------------------- measurements

def pass_rates(models: Dict[str, torch.nn.Module], x: torch.Tensor, y: torch.Tensor, precision: str = "fp32",
               reps: int = 5, warmup: int = 1) -> Dict[str, Dict[str, float]]:
    """name -> {"fwd_s", "fb_s", "fwd", "fb"}: seconds per batch and images/s of a forward and of a
    forward+backward-to-the-input pass. The models' forwards are timed interleaved with each other,
    then their forward+backwards (as bench_attention compares PID with softmax)."""
    dev = x.device
    tf = timed_interleaved({k: (lambda m=m: forward(m, x, precision)) for k, m in models.items()}, dev, reps, warmup)
    tb = timed_interleaved({k: (lambda m=m: forward_backward(m, x, y, precision)) for k, m in models.items()},
                           dev, reps, warmup)
    n = len(x)
    return {k: {"fwd_s": tf[k], "fb_s": tb[k], "fwd": n / tf[k], "fb": n / tb[k]} for k in models}


def pgd_calls(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, eps: float = 4 / 255,
              precision: str = "fp32", **pgd: Any) -> Dict[str, Callable[[], object]]:
    """The two sides of the PGD-cost ratio: ``steps`` bare forward+backward passes, and the harness's
    PGD class (early stop off: every sample every step) under the runner's autocast."""
    from ..attacks import make_attack

    attack = make_attack("pgd", eps=eps, steps=steps, early_stop=False, **pgd)
    dev = x.device

    def bare() -> None:
        for _ in range(steps):
            forward_backward(model, x, y, precision)

    def harness() -> None:
        with attack_precision(dev, precision):
            attack(model, x, y, generator=torch.Generator(device=dev).manual_seed(0))

    return {"bare k x f+b": bare, "harness PGD (early stop off)": harness}


def pgd_ratio(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, precision: str = "fp32",
              reps: int = 3, warmup: int = 1) -> Dict[str, float]:
    """{"bare_s", "harness_s", "ratio"}: harness PGD-k seconds / k bare forward+backward seconds
    (1.0 is the physical limit)."""
    t = timed_interleaved(pgd_calls(model, x, y, steps, precision=precision), x.device, reps, warmup)
    bare, harness = t["bare k x f+b"], t["harness PGD (early stop off)"]
    return {"bare_s": bare, "harness_s": harness, "ratio": harness / bare}


def calibration_pair(rates: Dict[str, float]) -> Tuple[float, float]:
    """(forward, forward+backward) images/s, rounded as ``evaluate --dry-run --calibration FWD,FB`` takes them."""
    return float(f"{rates['fwd']:.4g}"), float(f"{rates['fb']:.4g}")


def table1_passes(protocol: str = "paper") -> Dict[str, Tuple[float, float]]:
    """attack -> (forward, forward+backward) passes per image of the Table 1 suite, every sample
    attacked to the end: the dry run's own count (``Benchmark.passes`` on the units the adversarial
    benchmark plans, protocol settings applied), plus the clean pass."""
    from ..benchmarks import get_benchmark
    from ..benchmarks.adversarial import protocol_params
    from ..core.labels import parse_eps
    from ..specs import Unit

    bench = get_benchmark("adversarial")
    out: Dict[str, Tuple[float, float]] = {"clean": bench.passes(None, Unit("adversarial", "clean", 0.0, "{}", "", 0, 1))}
    for name, params in TABLE1_SUITE:
        eps = parse_eps(params["eps"]) if isinstance(params["eps"], str) else float(params["eps"])
        settings = protocol_params(name, {**params, "eps": eps}, protocol)
        f, b = bench.passes(None, Unit("adversarial", name, eps, json.dumps(settings, sort_keys=True), "", 0, 1))
        acc = out.get(name, (0.0, 0.0))
        out[name] = (acc[0] + f, acc[1] + b)
    return out


def table1_estimate(fwd_rate: float, fb_rate: float, images: int = TABLE1_IMAGES) -> Dict[str, Any]:
    """Seconds of Table 1's attack rows on one device at these rates: images x (forward passes /
    forward rate + forward+backward passes / f+b rate), as ``evaluate --dry-run --calibration`` prices
    each unit. Per attack and in total."""
    per = {k: images * (f / fwd_rate + b / fb_rate) for k, (f, b) in table1_passes().items()}
    passes = table1_passes()
    return {"images": images, "fwd_rate": fwd_rate, "fb_rate": fb_rate, "seconds": sum(per.values()),
            "per_attack_s": per, "fwd_passes": sum(f for f, _ in passes.values()),
            "fb_passes": sum(b for _, b in passes.values())}


def _saved_bytes(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str) -> int:
    """Bytes of the distinct storages autograd keeps for a forward+backward to the input."""
    seen: Dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    xr = x.detach().clone().requires_grad_(True)
    with torch.enable_grad(), attack_precision(x.device, precision), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = torch.nn.functional.cross_entropy(model(xr).float(), y, reduction="sum")
    torch.autograd.grad(loss, xr)
    return sum(seen.values())


def saved_bytes_per_sample(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str = "fp32") -> int:
    """Bytes autograd keeps per sample for a forward+backward to the input (the attack's memory peak
    beyond the weights): saved storages at batch ``len(x)`` minus at batch 1, over ``len(x) - 1``,
    so weights (saved whatever the batch) cancel. Saved-tensor hooks: any device, no allocator
    statistics needed."""
    n = len(x)
    if n < 2:
        raise ValueError("saved_bytes_per_sample needs a batch of at least 2")
    full, one = _saved_bytes(model, x, y, precision), _saved_bytes(model, x[:1], y[:1], precision)
    return max(1, (full - one) // (n - 1))


def host_memory_bytes() -> int:
    """Physical memory available now (Linux /proc/meminfo MemAvailable; total pages elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            for ln in f:
                if ln.startswith("MemAvailable:"):
                    return int(ln.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def largest_batch(model: torch.nn.Module, device: torch.device, precision: str = "fp32", size: int = 224,
                  limit: int = 1024, memory_bytes: Optional[int] = None, headroom: float = 0.8) -> Dict[str, Any]:
    """The largest power-of-two batch whose forward+backward to the input fits. CUDA: tried on the
    GPU (``device.find_batch_size``, what ``--batch-size 0`` runs). CPU: host memory (or
    ``memory_bytes``) x ``headroom`` over the bytes autograd saves per sample. {"batch", "how"};
    batch 0 when not even one sample fits."""
    if device.type == "cuda" and memory_bytes is None:
        from ..errors import UserError

        try:
            bs = find_batch_size(model, (3, size, size), device, precision, start=1, limit=limit)
        except UserError:
            bs = 0
        return {"batch": bs, "how": f"forward+backward tried on {device} (as --batch-size 0)"}
    x, _ = random_batch(2, device, size)
    with torch.inference_mode():
        classes = int(model(x[:1]).shape[-1])
    y = torch.arange(2, device=device) % classes
    per = saved_bytes_per_sample(model, x, y, precision)
    mem = host_memory_bytes() if memory_bytes is None else int(memory_bytes)
    fit, bs = 0, 1
    while bs <= limit and bs * per <= mem * headroom:
        fit, bs = bs, bs * 2
    return {"batch": fit, "how": f"{per / 2 ** 20:.1f} MiB saved per sample, {mem / 2 ** 30:.1f} GiB memory "
                                 f"x {headroom:g}", "bytes_per_sample": per, "memory_bytes": mem}


def machine() -> str:
    """One line describing where the figures were measured."""
    if torch.cuda.is_available():
        dev = f"GPU {torch.cuda.get_device_name(0)}"
    else:
        dev = f"CPU {cpu_model()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{dev}; torch {torch.__version__}; load average {load:.1f}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        return next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "?")
    except Exception:  # noqa: BLE001 - no lscpu: the platform's word
        return platform.processor() or "?"


def fmt_hours(seconds: float) -> str:
    """A duration a person reads: minutes, hours, days or years (600,000 h is 68 years, not a number of hours)."""
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 72 * 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds < 365 * 86400:
        return f"{seconds / 86400:.1f} days"
    return f"{seconds / (365.25 * 86400):.1f} years"


TABLE1_WHAT = ("PIDformer Table 1's attack rows (clean, FGSM and PGD-20 at 1..6/255, SPSA-40 x 128 directions, SLD-20, "
               "noise; paper protocol; no ImageNet-C/A/R/O)")


def summary_line(per_model: Dict[str, Dict[str, float]], names: Sequence[str]) -> str:
    return ", ".join(f"{n} fwd {per_model[n]['fwd']:.1f} / f+b {per_model[n]['fb']:.1f} img/s" for n in names)
