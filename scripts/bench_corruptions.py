"""Cost of ``--suite robustbench-corruptions`` on CIFAR-10-C: the harness end to end (memory-mapped reads of the
released arrays, batched conversion, forward passes, per-sample records, unit files, tables) against a plain loop
over the same arrays as RobustBench's ``corruptions_evaluation`` runs it (each file loaded whole with ``np.load``,
the severity's rows sliced, converted to float, forward in batches), same model, batch size and device, in one run.

    ratio = harness images/s / plain-loop images/s

Also the peak resident memory of each side above the process's own before it starts (the model loaded and run
once, the harness's modules imported by a warm-up run of 8 images per cell): the harness reads the rows of one batch
through a memory map it drops after the copy and holds one chunk at a time, so it should stay well under one whole
array (153.6 MB), set-up included; the plain loop holds a whole array (and its float copy of one severity).
The peak is sampled every 10 ms while the cells are scored (the harness: until its last unit file is written, so
the final tables, which read every record, are reported apart); for the harness also the part of it that is its
set-up, up to the start of its loop over the chunks (the dataset with the clean test images, the model's probe,
``plan.json``, whose sample ids are runs, not a string per image), and the growth above that while it scores.

    python scripts/bench_corruptions.py                       # a generated sparse release, 2,000 images per cell
    python scripts/bench_corruptions.py --data-root DIR --n 10000 --device cuda   # your CIFAR-10-C, whole cells
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict

import numpy as np
import torch

from _common import machine, pick_device, sync

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the released layout writer, TinyNet


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


FIRST_READ: Dict[str, int] = {}  # RSS when the harness starts its loop over the chunks: set up, nothing scored yet


def mark_first_read() -> None:
    """Record the RSS when the runner asks for its first chunk (dataset, model, plan and folder are set up by then;
    not the dataset's first read, which is the model's probe on one image, before the plan)."""
    from robustbench_pid.run.context import Context

    chunks = Context.chunks

    def first(self: Any, spans: Any) -> Any:
        FIRST_READ.setdefault("rss", rss())
        return chunks(self, spans)

    Context.chunks = first  # type: ignore[method-assign]


def count_unit_writes() -> Dict[str, int]:
    """A counter of the units the runner has written (each its parquet and json), so the sampler can tell when scoring
    ends without listing the folder every 10 ms: that listing, on the harness's side only, grew with the folder and
    took the GIL from the run it measured."""
    from robustbench_pid.run import runner

    got = {"n": 0}
    write = runner._write_unit

    def counted(*args: Any, **kwargs: Any) -> None:
        write(*args, **kwargs)
        got["n"] += 1

    runner._write_unit = counted  # type: ignore[assignment]
    return got


def peak_while(fn: Callable[[], Any], until: Callable[[], bool], device: torch.device) -> Dict[str, float]:
    """fn's wall time, and the peak RSS above the start while ``until()`` is false (and overall)."""
    FIRST_READ.clear()
    base, peak, stop = rss(), {"scoring": 0, "all": 0}, threading.Event()

    def sample() -> None:
        while not stop.is_set():
            r = rss()
            peak["all"] = max(peak["all"], r)
            if not until():
                peak["scoring"] = max(peak["scoring"], r)
            time.sleep(0.01)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0 = time.perf_counter()
    fn()
    sync(device)
    s = time.perf_counter() - t0
    stop.set()
    t.join()
    got = {"s": s, "scoring_growth_mb": max(0, peak["scoring"] - base) / 1e6,
           "all_growth_mb": max(0, peak["all"] - base) / 1e6}
    if "rss" in FIRST_READ:  # the harness: how much of it is its set-up (dataset, plan, ...), not scoring
        got["setup_mb"] = (FIRST_READ["rss"] - base) / 1e6
        got["scoring_growth_above_setup_mb"] = max(0, peak["scoring"] - FIRST_READ["rss"]) / 1e6
    return got


def plain_loop(model: torch.nn.Module, root: Path, n: int, bs: int, device: torch.device) -> float:
    """RobustBench's loop: per corruption and severity, the file loaded whole, rows sliced, / 255, batches."""
    from robustbench_pid.core.robustbench import corruption_order

    folder = root / "CIFAR-10-C"
    labels = np.load(folder / "labels.npy")
    correct = 0.0
    with torch.no_grad():
        for c in corruption_order():
            for s in range(1, 6):
                arr = np.load(folder / f"{c}.npy")
                x = torch.tensor(np.transpose(arr[(s - 1) * 10000:(s - 1) * 10000 + n], (0, 3, 1, 2)).astype(
                    np.float32) / 255)
                y = torch.tensor(labels[:n].astype(np.int64))
                del arr
                for k in range(0, n, bs):
                    out = model(x[k:k + bs].to(device))
                    correct += float((out.argmax(1) == y[k:k + bs].to(device)).sum())
    return correct


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", help="a folder holding CIFAR-10-C/ and cifar-10-batches-py/ (default: generated)")
    ap.add_argument("--n", type=int, default=2000, help="images per cell (--limit under the suite), at most 10,000")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=512, help="--chunk-size (samples per work unit)")
    ap.add_argument("--device", default="auto")
    a = ap.parse_args()
    import robustbench_pid as rbp
    from released_c import TinyNet, write_release

    device = pick_device(a.device)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    with tempfile.TemporaryDirectory(prefix="rbp-bench-c-") as tmp:
        root = Path(a.data_root) if a.data_root else write_release(Path(tmp) / "data", n=8, n_clean=a.n)
        model = TinyNet().eval().to(device)
        with torch.no_grad():
            model(torch.rand(a.batch, 3, 32, 32, device=device))
        mark_first_read()
        rbp.evaluate(model, dataset="cifar10", suite="robustbench-corruptions", data_root=str(root), limit=8,
                     device=str(device), out=str(Path(tmp) / "warm-up"), quiet=True)  # imports and caches: not counted
        out = Path(tmp) / "run"
        n_units = 76 * -(-a.n // a.chunk)
        written = count_unit_writes()

        def done() -> bool:  # every 10 ms: a counter, not a listing of units/ (1,520 units: 3,040 files)
            return written["n"] >= n_units

        harness = peak_while(lambda: rbp.evaluate(model, dataset="cifar10", suite="robustbench-corruptions",
                                                  data_root=str(root), limit=a.n, device=str(device), out=str(out),
                                                  quiet=True, batch_size=a.batch, chunk_size=a.chunk), done, device)
        plain = peak_while(lambda: plain_loop(model, root, a.n, a.batch, device), lambda: False, device)
    images = 76 * a.n  # the harness scores the clean images too; the plain loop only the 75 cells
    result = {"machine": machine(), "data": "your files" if a.data_root else "generated sparse release",
              "model": "TinyNet (tests/released_c.py)", "n_per_cell": a.n, "batch": a.batch,
              "harness": {"images": images, "images_per_s": images / harness["s"], **harness},
              "plain_loop": {"images": 75 * a.n, "images_per_s": 75 * a.n / plain["s"], **plain},
              "array_mb": 153.6}
    result["ratio"] = result["harness"]["images_per_s"] / result["plain_loop"]["images_per_s"]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
