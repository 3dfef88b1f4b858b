"""``cost``: what a model costs (RPC-Attention Table 13): parameters, multiply-adds per sample (as
MACs and as FLOPs), seconds per sample for inference and for one forward+backward (a training step
without the optimizer), and peak memory, at a stated batch size on the device in use.

Counts come from torch's own counter (``torch.utils.flop_counter.FlopCounterMode``) on one forward
pass of the batch: the multiply-adds of matmuls, convolutions and attention (``QK^T`` and ``AV``).
``macs_per_sample`` counts one per multiply-add (fvcore's convention, the one papers print as
"FLOPs" or GMACs), ``flops_per_sample`` two. Elementwise work is not counted: normalization,
softmax, activations, residual adds, PID's controller, PAP's shrinkage. The count must not depend on
which attention kernel would run: torch has no formula for the CPU kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``), so counted as is attention would be 0 on the
CPU and counted on CUDA. So the forward pass is counted under the math kernel
(``sdpa_kernel(SDPBackend.MATH)``: attention decomposes into counted matmuls), and the CPU kernel gets
torch's own attention formula too (:data:`EXTRA_FORMULAS`), so every kernel counts the same
(tests/test_cost.py pins it). Times and memory are not counts: they are measured with the kernel
torch picks on the device (flash attention uses far less memory than math), the device is named.

Times are the median of ``reps`` timed passes after one warm-up, synchronized on CUDA. Peak memory
is ``torch.cuda.max_memory_allocated`` over the pass (CUDA only: on the CPU it is recorded as
missing, not guessed). The batch is the run's first ``--batch-size`` samples (``--limit`` for fewer).
Records: one row per (sample, metric), every sample carrying the batch's per-sample value, its
``value_unit`` and ``convention`` (what was counted or timed, and how); ``device_name`` names the device
the times and memory belong to.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Tuple

import pandas as pd
import torch
import torch.nn.functional as F
import torch.utils.flop_counter as _fc
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..specs import Unit
from . import Benchmark, benchmarks

NAME = "cost"
METRICS = ("params", "macs_per_sample", "flops_per_sample", "sec_per_sample_test", "sec_per_sample_train",
           "peak_mem_test_mb", "peak_mem_train_mb")
COUNTED = "matmuls, convolutions and attention (QK^T, AV; counted under the math attention kernel)"
NOT_COUNTED = "elementwise work (norms, softmax, activations, PID's controller, PAP's shrinkage)"
# metric -> (unit, what it is): written into every record and summary row
CONVENTIONS = {
    "params": ("parameters", "every parameter of the model"),
    "macs_per_sample": ("MAC", f"1 per multiply-add of {COUNTED}; not counted: {NOT_COUNTED}"),
    "flops_per_sample": ("FLOP", f"2 per multiply-add of {COUNTED}; not counted: {NOT_COUNTED}"),
    "sec_per_sample_test": ("s", "median of the timed no-grad forward passes / batch size; attention kernel: "
                                 "torch's choice on this device"),
    "sec_per_sample_train": ("s", "median of the timed forward+backward passes / batch size; attention kernel: "
                                  "torch's choice on this device"),
    "peak_mem_test_mb": ("MiB", "torch.cuda.max_memory_allocated over the forward passes (CUDA only); attention "
                                "kernel: torch's choice on this device"),
    "peak_mem_train_mb": ("MiB", "torch.cuda.max_memory_allocated over the forward+backward passes (CUDA only); "
                                 "attention kernel: torch's choice on this device"),
}
KERNELS = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
           "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
# torch.utils.flop_counter has no formula for the CPU attention kernel (torch 2.14): give it torch's own
# (the one it uses for the CUDA kernels), so a count on the CPU kernel agrees with the math decomposition.
# Forward only: a fused kernel's backward recomputes QK^T, so backward counts differ by kernel anyway.
def _cpu_sdpa(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any) -> int:
    return int(_fc.sdpa_flop_count(query_shape, key_shape, value_shape))


_aten = torch.ops.aten
EXTRA_FORMULAS: Dict[Any, Callable[..., int]] = {
    _aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa,
}


@dataclass(frozen=True)
class OpCount:
    """Multiply-adds of one forward pass (matmuls, convolutions, attention), and per aten op as FLOPs."""

    flops: int  # 2 per multiply-add
    kernel: str  # the attention kernel the pass was allowed ("math" unless asked otherwise)
    by_op: Dict[str, int] = field(default_factory=dict)  # aten op -> FLOPs

    @property
    def macs(self) -> int:
        return self.flops // 2


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def count_ops(net: torch.nn.Module, x: torch.Tensor, kernel: str = "math") -> OpCount:
    """Multiply-adds of one forward pass of ``x`` (the whole batch) with attention run by ``kernel``.

    The default, ``"math"``, counts the same on every device; another kernel raises torch's
    ``RuntimeError`` where it cannot run these inputs (e.g. flash attention in fp32 on CUDA)."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown attention kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    with torch.no_grad(), sdpa_kernel(KERNELS[kernel]), \
            _fc.FlopCounterMode(display=False, custom_mapping=EXTRA_FORMULAS) as counter:
        net(x)
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return OpCount(int(counter.get_total_flops()), kernel, by_op)


def count_flops(net: torch.nn.Module, x: torch.Tensor, kernel: str = "math") -> int:
    """FLOPs (2 per multiply-add) of one forward pass of ``x`` (the whole batch); see :func:`count_ops`."""
    return count_ops(net, x, kernel).flops


def _timed(fn: Any, device: torch.device, reps: int) -> Dict[str, float]:
    fn()  # warm-up (kernels chosen, caches filled)
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan")
    return {"seconds": statistics.median(times), "peak_mb": peak}


def measure_cost(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, reps: int = 3) -> Dict[str, float]:
    """The cost metrics of ``net`` on batch ``(x, y)``, per sample (parameters: of the model)."""
    n, device = len(x), x.device
    was_training = net.training
    net.eval()

    def infer() -> None:
        with torch.no_grad():
            net(x)

    def train_step() -> None:
        net.zero_grad(set_to_none=True)
        F.cross_entropy(net(x).float(), y).backward()

    frozen = [p for p in net.parameters() if not p.requires_grad]  # evaluation models come frozen
    for p in frozen:
        p.requires_grad_(True)
    try:
        test = _timed(infer, device, reps)
        with torch.enable_grad():
            train = _timed(train_step, device, reps)
        net.zero_grad(set_to_none=True)
        flops = count_ops(net, x).flops
    finally:
        net.train(was_training)
        for p in frozen:
            p.requires_grad_(False)
    return {"params": float(sum(p.numel() for p in net.parameters())), "macs_per_sample": flops / 2 / n,
            "flops_per_sample": flops / n,
            "sec_per_sample_test": test["seconds"] / n, "sec_per_sample_train": train["seconds"] / n,
            "peak_mem_test_mb": test["peak_mb"], "peak_mem_train_mb": train["peak_mb"]}


@benchmarks.register(NAME)
class Cost(Benchmark):
    name = NAME
    samples = ("labelled", "restricted", "ood", "corrupted")  # it times a batch: any image will do
    group_cols = ["metric"]
    options = {"reps": "timed repetitions per measure (median; default 3)"}
    option_kinds = {"reps": "count"}

    def plan(self, ctx: Any) -> List[Unit]:
        n = min(len(ctx.indices), ctx.batch_size)
        reps = int(ctx.spec.benchmark_options.get(NAME, {}).get("reps", 3))
        params = json.dumps({"batch_size": n, "reps": reps, "device": str(ctx.device)}, sort_keys=True)
        return [Unit(NAME, "clean", 0.0, params, "", 0, n)]

    def passes(self, ctx: Any, unit: Unit) -> Tuple[float, float]:
        """Per sample of the batch: a warm-up and ``reps`` timed passes of each kind, plus the counted pass."""
        reps = json.loads(unit.params).get("reps", 3) if unit.params else 3
        return 2.0 + reps, 1.0 + reps

    def run_unit(self, ctx: Any, unit: Unit) -> pd.DataFrame:
        xs, ys, ids = [], [], []
        for b in self.batches(ctx, unit):
            xs.append(b.x)
            ys.append(b.y)
            ids += list(b.sample_ids)
            ctx.advance(len(b.sample_ids))
        x, y = torch.cat(xs), torch.cat(ys)
        cost = measure_cost(ctx.model, x, y, reps=json.loads(unit.params)["reps"])
        dev = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "cpu"
        return pd.DataFrame([{"sample_id": s, "label": int(lab), "metric": m, "value": float(cost[m]),
                              "batch_size": len(ids), "device_name": dev, "value_unit": CONVENTIONS[m][0],
                              "convention": CONVENTIONS[m][1]}
                             for s, lab in zip(ids, y.tolist()) for m in METRICS])
