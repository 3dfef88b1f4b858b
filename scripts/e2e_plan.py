"""``scripts/bench_e2e.py --plan-table1``: the planning figure of docs/scaling.md (the forward and forward+backward
image-passes of PIDformer Table 1 from ``evaluate --dry-run`` on a generated tree, scaled to 50,000 images and priced
at a given per-image throughput). Kept apart from the timing code of bench_e2e.py, which imports it for that flag.
"""
from __future__ import annotations

import argparse
import re
import shutil
import tempfile
from pathlib import Path
from typing import Dict, List

from bench_e2e import (H100_FB_IMG_S, MODEL, build_tree, count_tree, evaluate_cmd, fail, make_checkpoint,
                       run_timed, write_suite)


def fb_over_forward(ckpt: Path, device_name: str, batch: int) -> float:
    """Time of a forward+backward-to-the-input pass over a forward pass, PID DeiT-tiny, measured
    interleaved (``robustbench_pid.run.speed.pass_rates``, as doctor measures it; the dry run's
    calibration times them one after the other, which a busy machine skews)."""
    from _common import pick_device
    from robustbench_pid.models.zoo import load_model
    from robustbench_pid.run.speed import pass_rates, random_batch

    device = pick_device(device_name)
    model = load_model(MODEL, str(ckpt), "imagenet").to(device)
    x, y = random_batch(batch, device)
    r = pass_rates({"pid": model}, x, y, reps=3)["pid"]
    return r["fb_s"] / r["fwd_s"]


def main_plan(a: argparse.Namespace) -> None:
    from robustbench_pid.run.speed import TABLE1_SUITE, table1_estimate

    tmp = Path(tempfile.mkdtemp(prefix="bench_e2e_plan_"))
    try:
        tree = a.tree if a.tree is not None else tmp / "tree"
        if not (tree.is_dir() and any(tree.iterdir())):
            tree.mkdir(parents=True, exist_ok=True)
            build_tree(tree, min(a.n, 64))
        n = count_tree(tree)
        ckpt = tmp / "pid_deit_tiny_random.pth"
        make_checkpoint(ckpt)
        suite = tmp / "table1.toml"
        write_suite(suite, TABLE1_SUITE)
        cmd = evaluate_cmd(argparse.Namespace(**{**vars(a), "precision": "fp32"}), tree, ckpt, suite, tmp / "run")
        _, text = run_timed(cmd + ["--dry-run"])
        tot = re.search(r"(\d+) forward and (\d+) forward\+backward image-passes", text)
        cal = re.search(r"forward ([\d.]+) ms/img, forward\+backward ([\d.]+) ms/img", text)
        if tot is None or cal is None:
            fail(f"no totals/calibration line in the dry-run output:\n{text}")
        f_n, fb_n = int(tot.group(1)) / n, int(tot.group(2)) / n
        ratio = float(cal.group(2)) / float(cal.group(1))
        fb_rate = a.plan_fb_rate or H100_FB_IMG_S.get(a.precision)
        if fb_rate is None:
            fail(f"no quoted H100 figure for --precision {a.precision}; give --plan-fb-rate")
        measured = fb_over_forward(ckpt, a.device, a.batch_size)
        fwd_rate = a.plan_fwd_rate or fb_rate * measured
        units = [ln for ln in text.splitlines() if re.match(r"^[0-9a-f]{12} ", ln)]
        per_attack: Dict[str, List[float]] = {}
        for ln in units:
            parts = ln.split()
            f, b, m = float(parts[-4]), float(parts[-3]), parts[5]
            lo, hi = (int(v) for v in m.split(":"))
            key = parts[2]
            acc = per_attack.setdefault(key, [0.0, 0.0])
            acc[0] += f * (hi - lo) / n
            acc[1] += b * (hi - lo) / n
        big = a.plan_images
        est = table1_estimate(fwd_rate, fb_rate, big)  # the package's estimate (doctor prints the same)
        if (round(est["fwd_passes"]), round(est["fb_passes"])) != (round(f_n), round(fb_n)):
            fail(f"robustbench_pid.run.speed.table1_passes counts {est['fwd_passes']:.0f} + {est['fb_passes']:.0f} "
                 f"passes per image, the dry run {f_n:.0f} + {fb_n:.0f}")
        total = est["seconds"]
        print(f"# dry run: {' '.join(cmd)} --dry-run")
        print(f"# on this machine, {n} images; dry-run calibration {cal.group(0)} (f+b / forward = {ratio:.2f}, "
              f"timed one after the other); interleaved here, batch {a.batch_size}: f+b / forward = {measured:.2f}")
        print(f"per image: {f_n:.0f} forward + {fb_n:.0f} forward+backward passes")
        print(f"{'attack':8} {'fwd/img':>9} {'f+b/img':>8} {'hours':>7}")
        for k, (f, b) in per_attack.items():
            print(f"{k:8} {f:>9.0f} {b:>8.0f} {big * (f / fwd_rate + b / fb_rate) / 3600:>7.2f}")
        print(f"rates: forward+backward {fb_rate:,.0f} img/s ({'given' if a.plan_fb_rate else 'issue 10, H100 ' + a.precision}), "
              f"forward {fwd_rate:,.0f} img/s ({'given' if a.plan_fwd_rate else 'f+b rate x the f+b / forward ratio measured here, interleaved'})")
        print(f"Table 1 (no ImageNet-C/A/R/O), {big:,} images, one GPU: {big:,} x ({f_n:.0f} / {fwd_rate:,.0f} + "
              f"{fb_n:.0f} / {fb_rate:,.0f}) s = {total:,.0f} s = {total / 3600:.1f} h")
        # the same figure from evaluate itself, its dry run priced at these rates (--calibration)
        _, priced = run_timed(cmd + ["--dry-run", "--calibration", f"{fwd_rate:.6g},{fb_rate:.6g}"])
        own = re.search(r"about ([\d.]+) (s|min|h) at the given calibration", priced)
        if own is None:
            fail(f"no priced total in the dry-run output:\n{priced}")
        own_s = float(own.group(1)) * {"s": 1, "min": 60, "h": 3600}[own.group(2)] * big / n
        print(f"  evaluate --dry-run --calibration {fwd_rate:.6g},{fb_rate:.6g} on the {n} images: {own.group(0)}; "
              f"x {big:,} / {n} = {own_s / 3600:.1f} h")
        print(f"  4 GPUs each redoing the whole set (the seed papers' setup): {total / 3600:.1f} h wall, "
              f"{4 * total / 3600:.1f} GPU-hours; 4 shards of this harness: {total / 4 / 3600:.1f} h wall, "
              f"{total / 3600:.1f} GPU-hours")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
