"""The fast attack path: ``--precision bf16 --compile`` against fp32 eager, PGD-20.

Two measurements in one run:

1. Throughput. PGD-20 at 3/255 with the paper's settings (step 0.15 eps, random start, every
   sample attacked every step: early stop off) on one batch of PID DeiT-tiny at 224 px (seeded
   random weights: the cost does not depend on them), through the harness's attack path: the
   project's PGD class on the model, under the autocast the runner uses
   (``device.attack_precision``), on ``torch.compile(model)`` as ``evaluate --compile`` makes it
   (once, reused by every call). Candidates: fp32 eager, FAST eager, FAST + compile, timed
   interleaved after a warm-up that also pays the compilation.

       ratio = fp32 eager seconds / candidate seconds     target for bf16 + compile on a GPU: >= 3

2. Robust accuracy. The embedded digits PID DeiT (trained by the project), ``rbp.evaluate`` PGD-20
   at 4/255 on all 360 test digits, fp32 eager against FAST + compile (the whole runner path:
   clean pass, attack, fp32 verdicts): robust top-1 of each, the difference in points (target:
   within 1) and how many samples' verdicts differ.

FAST is bf16 on CUDA. A CPU has no fast half precision (evaluate refuses it there), so on a CPU
``--fast fp32`` measures what compilation alone gives:

    python scripts/bench_fast_path.py                         # one GPU: bf16
    OMP_NUM_THREADS=2 python scripts/bench_fast_path.py --fast fp32 --batch 8 --reps 3   # CPU
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from _common import machine, pick_device, timed_interleaved
from bench_attack import build


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--fast", choices=["bf16", "fp16", "fp32"], default=None,
                    help="precision of the fast path (default bf16 on CUDA; a CPU accepts only fp32)")
    ap.add_argument("--batch", type=int, default=None, help="throughput batch (default 256 on CUDA, 8 on CPU)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--skip-accuracy", action="store_true", help="throughput only")
    a = ap.parse_args()
    device = pick_device(a.device)
    fast = a.fast or ("bf16" if device.type == "cuda" else "fp32")
    if fast != "fp32" and device.type != "cuda":
        raise SystemExit(f"error: --fast {fast} needs a CUDA device (evaluate refuses it on CPU); use --fast fp32")
    batch = a.batch or (256 if device.type == "cuda" else 8)

    from robustbench_pid.run.speed import pgd_calls

    model, x, y = build("imagenet", batch, device)
    compiled = torch.compile(model)

    def attack(m: torch.nn.Module, precision: str) -> None:  # the harness's PGD call, as doctor times it
        pgd_calls(m, x, y, a.steps, eps=3 / 255, precision=precision, step_size_factor=0.15,
                  random_start=True)["harness PGD (early stop off)"]()

    cands = {"fp32 eager": lambda: attack(model, "fp32")}
    if fast != "fp32":
        cands[f"{fast} eager"] = lambda: attack(model, fast)
    cands[f"{fast} + compile"] = lambda: attack(compiled, fast)
    t = timed_interleaved(cands, device, reps=a.reps)
    base = t["fp32 eager"]
    print(f"# bench_fast_path: PID DeiT-tiny 224 px (random weights), batch {batch}, PGD-{a.steps} at 3/255 "
          f"(paper settings, every sample every step), device {device}")
    print(f"# {machine()}")
    for name, s in t.items():
        print(f"{name:22s} {s:9.3f} s   {batch / s:9.1f} img/s   fp32 eager / this = {base / s:.2f}")

    if a.skip_accuracy:
        return
    import pandas as pd

    import robustbench_pid as rbp

    got = {}
    with tempfile.TemporaryDirectory(prefix="bench_fast_path_") as tmp:
        for name, opts in (("fp32 eager", {}), (f"{fast} + compile", {"precision": fast, "compile": True})):
            out = Path(tmp) / name.replace(" ", "_").replace("+", "")
            rbp.evaluate("pid_deit", attack="pgd", eps="4/255", steps=a.steps, device=str(device), out=out, **opts)
            rec = pd.read_parquet(out / "records.parquet")
            got[name] = rec[rec.attack == "pgd"].set_index("sample_id")["correct_top1"]
    (n0, r0), (n1, r1) = got.items()
    acc0, acc1 = 100 * r0.mean(), 100 * r1.mean()
    differ = int((r0 != r1.reindex(r0.index)).sum())
    print(f"robust top-1, embedded digits PID DeiT, PGD-{a.steps} at 4/255, {len(r0)} samples: "
          f"{n0} {acc0:.2f}, {n1} {acc1:.2f}, difference {acc1 - acc0:+.2f} points; verdicts differ on {differ} samples")


if __name__ == "__main__":
    main()
