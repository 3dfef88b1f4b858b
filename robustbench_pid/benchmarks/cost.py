"""``cost``: what a model costs (RPC-Attention Table 13): parameters, FLOPs per sample, seconds per
sample for inference and for one forward+backward (a training step without the optimizer), and
peak memory, at a stated batch size on the device in use.

FLOPs come from torch's own counter (``torch.utils.flop_counter.FlopCounterMode``: matmuls,
convolutions and attention kernels, 2 FLOPs per multiply-add; elementwise work is not counted),
on one forward pass of the batch. Times are the median of ``reps`` timed passes after one warm-up,
synchronized on CUDA. Peak memory is ``torch.cuda.max_memory_allocated`` over the pass (CUDA only:
on the CPU it is recorded as missing, not guessed). The batch is the run's first ``--batch-size``
samples (``--limit`` for fewer). Records: one row per (sample, metric), every sample carrying the
batch's per-sample value; ``device`` names the device the times and memory belong to.
"""
from __future__ import annotations

import json
import statistics
import time
from typing import Any, Dict, List, Tuple

import pandas as pd
import torch
import torch.nn.functional as F

from ..specs import Unit
from . import Benchmark, benchmarks

NAME = "cost"
METRICS = ("params", "flops_per_sample", "sec_per_sample_test", "sec_per_sample_train", "peak_mem_test_mb",
           "peak_mem_train_mb")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def count_flops(net: torch.nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one forward pass of ``x`` (the whole batch), torch's flop counter."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        net(x)
    return int(counter.get_total_flops())


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
        flops = count_flops(net, x)
    finally:
        net.train(was_training)
        for p in frozen:
            p.requires_grad_(False)
    return {"params": float(sum(p.numel() for p in net.parameters())), "flops_per_sample": flops / n,
            "sec_per_sample_test": test["seconds"] / n, "sec_per_sample_train": train["seconds"] / n,
            "peak_mem_test_mb": test["peak_mb"], "peak_mem_train_mb": train["peak_mb"]}


@benchmarks.register(NAME)
class Cost(Benchmark):
    name = NAME
    group_cols = ["metric"]
    options = {"reps": "timed repetitions per measure (median; default 3)"}

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
                              "batch_size": len(ids), "device_name": dev}
                             for s, lab in zip(ids, y.tolist()) for m in METRICS])
