"""Clean-evaluation throughput: the harness (data loading, forward, records, unit files, final
tables) against a bare forward loop over tensors already in memory, same model, batch, device.

    ratio = harness images/s / bare images/s            target >= 0.9

The harness side is ``runner.run`` on a clean-only spec, minus the model/dataset set-up
(``prepare``, timed separately and reported), so it counts the DataLoader, the forward passes,
building the per-sample records, the atomic unit writes and the finalize step.

    python scripts/bench_clean.py --data digits                  # 360 embedded images, 32x32
    python scripts/bench_clean.py --data synthetic224 --n 512    # DeiT-tiny 224, random weights
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import torch

from _common import machine, pick_device, sync


class Synthetic224(torch.utils.data.Dataset):
    """uint8 images held in memory, converted per item like a decoded-image pipeline would."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (n, 3, 224, 224), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 1000, (n,), generator=g)
        self.sample_ids = [f"syn{i:06d}" for i in range(n)]
        self.provenance = {"dataset": "bench-synthetic224", "n": n}

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        return self.images[i].float().div_(255), int(self.labels[i])


def register_synthetic(n: int) -> None:
    from robustbench_pid.data import DatasetInfo, datasets

    if "bench-synthetic224" not in datasets:  # (reading the registry imports the dataset modules first)
        datasets.add("bench-synthetic224", DatasetInfo(
            "bench-synthetic224", "imagenet", 1000, "benchmark only: random uint8 images",
            factory=lambda split, root, model_info, **_: Synthetic224(n)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", choices=["digits", "synthetic224"], default="digits")
    ap.add_argument("--split", default="test", help="digits: test (360 images) or train (1437)")
    ap.add_argument("--n", type=int, default=256, help="synthetic224: number of images")
    ap.add_argument("--batch", type=int, default=None, help="default 128 (digits), 64 (synthetic224)")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="auto")
    a = ap.parse_args()
    device = pick_device(a.device)

    from robustbench_pid.run.context import prepare
    from robustbench_pid.run.runner import run
    from robustbench_pid.specs import RunSpec

    if a.data == "digits":
        base = dict(model="pid_deit", dataset="digits", split=a.split)
        batch = a.batch or 128
    else:
        register_synthetic(a.n)
        base = dict(model="timm:pid_deit_tiny_patch16_224", dataset="bench-synthetic224")
        batch = a.batch or 64
    spec_kw: Dict[str, Any] = dict(**base, batch_size=batch, chunk_size=512, device=str(device), quiet=True,
                                   num_workers=a.workers)
    ctx = prepare(RunSpec(**spec_kw))
    model = ctx.model
    ds = ctx.dataset
    n = len(ds)
    xs = torch.stack([ds[i][0] for i in range(n)]).to(device)  # preloaded, on the device

    def bare() -> None:
        with torch.inference_mode():
            for s in range(0, n, batch):
                model(xs[s:s + batch]).argmax(1)
        sync(device)

    tmp = Path(tempfile.mkdtemp(prefix="bench_clean_"))
    rep = [0]

    def harness() -> float:
        rep[0] += 1
        out = tmp / f"run{rep[0]}"
        t = time.perf_counter()
        run(RunSpec(out=out, **spec_kw))
        total = time.perf_counter() - t
        shutil.rmtree(out)
        return total

    t = time.perf_counter()
    prepare(RunSpec(**spec_kw))
    t_prep = time.perf_counter() - t
    bare()
    harness()  # warm-up both
    tb: List[float] = []
    th: List[float] = []
    tp: List[float] = []
    for _ in range(a.reps):
        t = time.perf_counter()
        bare()
        tb.append(time.perf_counter() - t)
        t = time.perf_counter()
        prepare(RunSpec(**spec_kw))
        tp.append(time.perf_counter() - t)
        th.append(harness())
    shutil.rmtree(tmp, ignore_errors=True)
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    b, h, p = med(tb), med(th), med(tp)
    print(f"# bench_clean: data {a.data} ({n} images), batch {batch}, workers {a.workers}, device {device}")
    print(f"# {machine()}")
    print(f"bare forward on preloaded tensors:  {b:8.3f} s  ({n / b:9.1f} img/s)")
    print(f"harness run() total:                {h:8.3f} s  (model + dataset set-up {p:.3f} s of it)")
    print(f"harness without set-up:             {h - p:8.3f} s  ({n / (h - p):9.1f} img/s)")
    print(f"throughput ratio harness/bare (set-up excluded): {b / (h - p):.3f}")
    print(f"throughput ratio harness/bare (set-up included): {b / h:.3f}")


if __name__ == "__main__":
    main()
