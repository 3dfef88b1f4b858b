"""Sharding speed-up: the same evaluation as 1 process, and as 2 shards (``--shard 0/2`` and
``--shard 1/2``) running in parallel into one folder, each shard one process with the same
threads as the single one. Also checks the two give identical per-sample records.

On a CPU machine each shard gets one core (OMP_NUM_THREADS=1); with GPUs pass --device cuda and
each shard gets its own GPU (CUDA_VISIBLE_DEVICES), as torchrun would give it.

    python scripts/bench_shards.py --limit 120 --steps 10
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

import pandas as pd

from _common import machine


def launch(args: List[str], out: Path, shard: str, threads: int, gpu: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if gpu:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    cmd = [sys.executable, "-m", "robustbench_pid", "evaluate", *args, "--out", str(out), "--quiet"]
    if shard:
        cmd += ["--shard", shard]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def compute_seconds(out: Path) -> float:
    return max(json.loads(p.read_text()).get("wall_seconds", 0) for p in (out / "shards").glob("*.json"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=120)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--eps", default="1/255,2/255,4/255")
    ap.add_argument("--chunk-size", type=int, default=20)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    a = ap.parse_args()
    args = ["--model", "pid_deit", "--attack", "pgd", "--eps", a.eps, "--steps", str(a.steps),
            "--limit", str(a.limit), "--chunk-size", str(a.chunk_size), "--device", a.device]
    tmp = Path(tempfile.mkdtemp(prefix="bench_shards_"))
    gpus = ["0", "1"] if a.device.startswith("cuda") else ["", ""]
    try:
        t = time.perf_counter()
        p = launch(args, tmp / "one" / "run", "", a.threads, gpus[0])
        assert p.wait() == 0, p.stderr.read()
        t_one = time.perf_counter() - t
        t = time.perf_counter()
        ps = [launch(args, tmp / "two" / "run", f"{i}/2", a.threads, gpus[i]) for i in range(2)]
        for q in ps:
            assert q.wait() == 0, q.stderr.read()
        t_two = time.perf_counter() - t
        r1 = pd.read_parquet(tmp / "one" / "run" / "records.parquet")
        r2 = pd.read_parquet(tmp / "two" / "run" / "records.parquet")
        same = r1.equals(r2)
        w1, w2 = compute_seconds(tmp / "one" / "run"), compute_seconds(tmp / "two" / "run")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n_units = len(r1["unit"].unique())
    print(f"# bench_shards: pid_deit digits, PGD-{a.steps} eps {a.eps}, {a.limit} samples, {n_units} units, "
          f"device {a.device}, {a.threads} thread(s) per process")
    print(f"# {machine()}")
    print(f"1 process:            {t_one:7.2f} s wall ({w1:.2f} s inside run())")
    print(f"2 shards in parallel: {t_two:7.2f} s wall ({w2:.2f} s inside run(), slowest shard)")
    print(f"speed-up, whole commands: {t_one / t_two:.2f}x;  inside run(): {w1 / w2:.2f}x")
    print(f"per-sample records identical: {same}")


if __name__ == "__main__":
    main()
