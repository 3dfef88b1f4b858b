"""End to end: the ``evaluate`` command against a plain loop doing the same work on the same JPEGs.

Builds (in a temp folder outside the repository, or ``--tree DIR``) an ImageNet-validation tree of
N JPEGs (real wnids, 500x375 / 500x333 / 375x500 / 333x500, varied content, quality 90) and a
seeded random-init PID DeiT-tiny checkpoint (no pretrained weights are needed or downloaded), then
times, side by side in one run of this script, per scenario:

  evaluate  ``python -m robustbench_pid evaluate --model pid_deit --checkpoint CK --dataset imagenet
            --data-root TREE --protocol paper ...`` as a subprocess: the whole command a user pays,
            interpreter start, imports, model and data loading, run folder and tables included.
  plain     a subprocess running torchvision ImageFolder + DataLoader (same batch, workers and
            transform: Resize(floor(224 / 0.875) = 256, bicubic, antialias) + CenterCrop(224) +
            ToTensor, normalization inside the model) + the same model + the project's attack
            classes with the paper-protocol settings, top-1 counted on the device. Its time runs
            from after its imports to the last batch; its interpreter start + imports are printed
            separately.

Scenarios: ``clean`` (decode + forward), ``pgd`` (one PGD-20 at 3/255, paper protocol: 0.15*eps
steps, random start, every sample attacked, no early stop), ``sweep`` (FGSM and PGD at 1..6/255, 12
conditions; the plain loop decodes each image once and applies all 12 to each batch).

    ratio = plain seconds / evaluate seconds  (throughput of evaluate relative to the plain loop; target >= 0.9)

    python scripts/bench_e2e.py --n 32 --batch-size 16 --workers 1 --steps 3     # CPU smoke (reduced PGD)
    python scripts/bench_e2e.py --n 5000 --batch-size 256 --workers 14           # one GPU, paper settings

``--plan-table1`` instead prints the planning figure of docs/scaling.md: the forward and
forward+backward image-passes of PIDformer Table 1 (clean, FGSM and PGD at 1..6/255, SPSA, SLD,
noise; paper protocol) from ``evaluate --dry-run`` on the tree, scaled to 50,000 images and priced
at a given per-image throughput (default: the H100 figures quoted in issue 10).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = ("clean", "pgd", "sweep")
PAPER_PGD_STEPS = 20
MODEL = "pid_deit"  # the zoo alias users run (PID DeiT-tiny on ImageNet-family data)
ARCH = "pid_deit_tiny_patch16_224"
# issue 10, measured by its author on one H100: PID DeiT-tiny, batch 256, 224 px, f+b to the input
H100_FB_IMG_S = {"fp32": 3941.0, "bf16": 9300.0}


def fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


# --------------------------------------------------------------------------- options

def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=None, help="images in the generated tree (default 64 on CPU, 5000 on CUDA)")
    ap.add_argument("--tree", type=Path, help="reuse this tree (built there first if the folder is missing or empty)")
    ap.add_argument("--keep-tree", action="store_true", help="keep the generated temp folder (tree + checkpoint)")
    ap.add_argument("--batch-size", type=int, default=None, help="default 32 on CPU, 256 on CUDA")
    ap.add_argument("--workers", type=int, default=None,
                    help="DataLoader workers on both sides (default: 0 with <= 2 cores, else min(14, cores - 2))")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    ap.add_argument("--steps", type=int, default=PAPER_PGD_STEPS,
                    help=f"PGD steps (paper: {PAPER_PGD_STEPS}; fewer for a CPU smoke, reported in the output)")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                    help="attack forward/backward precision (CUDA only), passed to both sides")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated subset of {','.join(SCENARIOS)}")
    ap.add_argument("--reps", type=int, default=1, help="repetitions (plain, evaluate interleaved); medians reported")
    ap.add_argument("--plan-table1", action="store_true",
                    help="print the Table 1 planning figure from `evaluate --dry-run` instead of timing")
    ap.add_argument("--plan-images", type=int, default=50_000, help="--plan-table1: images to plan for")
    ap.add_argument("--plan-fb-rate", type=float, default=None,
                    help="--plan-table1: forward+backward images/s of the target GPU (default: issue 10's H100 "
                         "figure for --precision: 3,941 fp32, 9,300 bf16)")
    ap.add_argument("--plan-fwd-rate", type=float, default=None,
                    help="--plan-table1: forward images/s of the target GPU (default: fb rate x the "
                         "forward+backward / forward time ratio measured here, interleaved)")
    ap.add_argument("--plain-worker", help=argparse.SUPPRESS)  # internal: JSON settings of the plain-loop subprocess
    a = ap.parse_args(argv)
    if a.plain_worker:
        return a
    import torch

    if a.device == "auto":
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if not re.fullmatch(r"cpu|cuda(:\d+)?", a.device):
        fail(f"--device {a.device!r} is not one of auto, cpu, cuda, cuda:N")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        fail(f"--device {a.device}: no CUDA device is visible here; use --device cpu")
    cuda = a.device.startswith("cuda")
    if a.precision != "fp32" and not cuda and not a.plan_table1:
        fail(f"--precision {a.precision} needs a CUDA device (evaluate refuses it on CPU); use fp32")
    a.n = a.n if a.n is not None else (5000 if cuda else 64)
    a.batch_size = a.batch_size if a.batch_size is not None else (256 if cuda else 32)
    cores = os.cpu_count() or 1
    a.workers = a.workers if a.workers is not None else (0 if cores <= 2 else min(14, cores - 2))
    for name, value, low in (("--n", a.n, 1), ("--batch-size", a.batch_size, 1), ("--workers", a.workers, 0),
                             ("--steps", a.steps, 1), ("--reps", a.reps, 1), ("--plan-images", a.plan_images, 1)):
        if value < low:
            fail(f"{name} must be >= {low}, got {value}")
    for name, value in (("--plan-fb-rate", a.plan_fb_rate), ("--plan-fwd-rate", a.plan_fwd_rate)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            fail(f"{name} must be a positive number of images/s, got {value}")
    a.scenarios = [s.strip() for s in a.scenarios.split(",") if s.strip()]
    bad = [s for s in a.scenarios if s not in SCENARIOS]
    if bad or not a.scenarios:
        fail(f"--scenarios: unknown {', '.join(map(repr, bad)) or '(none given)'}; choose from {', '.join(SCENARIOS)}")
    return a


# --------------------------------------------------------------------------- the tree and the checkpoint

# the tree's generator lives in the package (robustbench_pid.data.generators.jpeg_tree), shared with `robustbench-pid doctor`
from robustbench_pid.data.generators.jpeg_tree import SIZES, build_tree, make_image  # noqa: E402,F401


def tree_stats(root: Path) -> Tuple[int, float]:
    files = [f for d in root.iterdir() if d.is_dir() for f in d.iterdir()]
    return len(files), sum(f.stat().st_size for f in files) / max(1, len(files)) / 1024


def count_tree(root: Path) -> int:
    """Images in an existing tree; a clear error if it is not the class-folder layout."""
    from robustbench_pid.core.imagenet_info import wnid_to_index

    w2i = wnid_to_index()
    dirs = [d for d in root.iterdir() if not d.name.startswith(".")]
    bad = [d.name for d in dirs if not (d.is_dir() and d.name in w2i)]
    if bad:
        fail(f"--tree {root}: {bad[0]!r} is not an ImageNet class folder (wnid); give an ImageNet-layout tree "
             f"or an empty/missing folder to build one")
    n = sum(1 for d in dirs for f in d.iterdir() if f.suffix.lower() in (".jpeg", ".jpg", ".png"))
    if n == 0:
        fail(f"--tree {root}: the class folders hold no images")
    return n


def make_checkpoint(path: Path) -> None:
    """Seeded random-init PID DeiT-tiny weights, so both sides run the very same network."""
    import torch

    from robustbench_pid.models.zoo import build_model

    torch.manual_seed(0)
    torch.save(build_model(ARCH, num_classes=1000).state_dict(), path)


# --------------------------------------------------------------------------- the two sides

def conditions(scenario: str, steps: int) -> List[Tuple[str, Dict[str, Any]]]:
    """(attack, settings before the paper protocol is applied) of a scenario, as the CLI gets them."""
    if scenario == "clean":
        return []
    if scenario == "pgd":
        return [("pgd", {"eps": "3/255", "steps": steps})]
    from robustbench_pid.run.speed import SWEEP_EPS

    return [("fgsm", {"eps": e}) for e in SWEEP_EPS] + [("pgd", {"eps": e, "steps": steps}) for e in SWEEP_EPS]


def write_suite(path: Path, conds: List[Tuple[str, Dict[str, Any]]]) -> None:
    lines = []
    for name, params in conds:
        lines.append(f"[[attack]]\nname = \"{name}\"")
        lines += [f"{k} = {json.dumps(v)}" for k, v in params.items()]
        lines.append("")
    path.write_text("\n".join(lines))


def subprocess_env() -> Dict[str, str]:
    """This checkout's package first on the path, whatever is installed in the environment."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def evaluate_cmd(a: argparse.Namespace, tree: Path, ckpt: Path, suite: Optional[Path], out: Path) -> List[str]:
    cmd = [sys.executable, "-m", "robustbench_pid", "evaluate", "--model", MODEL, "--checkpoint", str(ckpt),
           "--dataset", "imagenet", "--data-root", str(tree), "--protocol", "paper",
           "--batch-size", str(a.batch_size), "--workers", str(a.workers), "--device", a.device,
           "--precision", a.precision, "--quiet", "--out", str(out)]
    return cmd + (["--suite", str(suite)] if suite is not None else [])


def run_timed(cmd: List[str]) -> Tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env())
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        fail(f"command failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr.strip()[-3000:]}")
    return wall, proc.stdout


def evaluate_top1(out: Path) -> Dict[str, float]:
    import pandas as pd

    s = pd.read_csv(out / "summary.csv")
    s = s[s["metric"] == "top1"]
    return {f"{r.attack}@{r.eps:.6f}": float(r.value) for r in s.itertuples()}


def plain_loop(cfg: Dict[str, Any], t_script: float) -> Dict[str, Any]:
    """The plain loop (runs in its own process): decode each image once, clean pass, every condition."""
    import torch
    from torchvision import datasets as tvd
    from torchvision import transforms as T

    from robustbench_pid.attacks import make_attack
    from robustbench_pid.core.labels import parse_eps
    from robustbench_pid.benchmarks.adversarial import protocol_params
    from robustbench_pid.runtime.device import attack_precision
    from robustbench_pid.core.imagenet_info import wnid_to_index
    from robustbench_pid.models.zoo import load_model

    t0 = time.perf_counter()
    device = torch.device(cfg["device"])
    model = load_model(MODEL, cfg["checkpoint"], "imagenet").to(device)
    size = int(model.info["input_size"][-1])
    interp = T.InterpolationMode[str(model.info["interpolation"]).upper()]  # bicubic for DeiT
    tf = T.Compose([T.Resize(int(math.floor(size / model.info["crop_pct"])), interp, antialias=True),
                    T.CenterCrop(size), T.ToTensor()])
    w2i = wnid_to_index()

    class WnidFolder(tvd.ImageFolder):  # labels = index in the 1000 sorted wnids, as the project's
        def find_classes(self, directory: str) -> Tuple[List[str], Dict[str, int]]:
            classes = sorted(d.name for d in os.scandir(directory) if d.is_dir())
            return classes, {c: w2i[c] for c in classes}

    ds = WnidFolder(cfg["tree"], transform=tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=cfg["batch_size"], num_workers=cfg["workers"],
                                         pin_memory=device.type == "cuda")
    attacks = []
    for name, params in cfg["conditions"]:
        settings = protocol_params(name, {**params, "eps": parse_eps(params["eps"])}, "paper")
        attacks.append((f"{name}@{settings['eps']:.6f}", make_attack(name, **settings), torch.Generator().manual_seed(0)))
    correct = {"clean@0.000000": torch.zeros((), dtype=torch.long, device=device)}
    correct.update({k: torch.zeros((), dtype=torch.long, device=device) for k, _, _ in attacks})
    n = 0
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        n += len(y)
        with torch.inference_mode():
            clean_logits = model(x)
        clean_pred = clean_logits.argmax(1)  # outside inference mode: the attacks' autograd may save it
        correct["clean@0.000000"] += (clean_pred == y).sum()
        z = model.normalize(x) if attacks else None
        for key, attack, gen in attacks:  # paper protocol: normalized space, no clipping, clean-prediction labels
            with attack_precision(device, cfg["precision"]):
                z_adv = attack(model.net, z, clean_pred, bounds=None, generator=gen)
            with torch.inference_mode():
                correct[key] += (model.net(z_adv).argmax(1) == y).sum()
    top1 = {k: 100.0 * v.item() / n for k, v in correct.items()}  # the one host sync
    work = time.perf_counter() - t0
    return {"work_s": work, "in_script_s": time.perf_counter() - t_script, "n": n, "top1": top1}


# --------------------------------------------------------------------------- timing

def time_scenario(a: argparse.Namespace, scenario: str, tree: Path, ckpt: Path, work: Path) -> Dict[str, Any]:
    conds = conditions(scenario, a.steps)
    suite = None
    if conds:
        suite = work / f"{scenario}.toml"
        write_suite(suite, conds)
    cfg = {"device": a.device, "checkpoint": str(ckpt), "tree": str(tree), "batch_size": a.batch_size,
           "workers": a.workers, "precision": a.precision, "conditions": conds}
    plain_cmd = [sys.executable, str(Path(__file__).resolve()), "--plain-worker", json.dumps(cfg)]
    res: Dict[str, List[float]] = {"plain_wall": [], "plain_work": [], "eval_wall": [], "eval_run": []}
    top1_plain: Dict[str, float] = {}
    top1_eval: Dict[str, float] = {}
    for rep in range(a.reps):
        wall, stdout = run_timed(plain_cmd)
        got = json.loads(stdout.strip().splitlines()[-1])
        res["plain_wall"].append(wall)
        res["plain_work"].append(got["work_s"])
        top1_plain = got["top1"]
        out = work / f"run_{scenario}_{rep}"
        cmd = evaluate_cmd(a, tree, ckpt, suite, out)
        wall, _ = run_timed(cmd)
        res["eval_wall"].append(wall)
        res["eval_run"].append(float(json.loads((out / "run.json").read_text())["wall_seconds"]))
        top1_eval = evaluate_top1(out)
        shutil.rmtree(out)
    m = {k: statistics.median(v) for k, v in res.items()}
    return {"scenario": scenario, "conditions": len(conds), **m, "top1_plain": top1_plain, "top1_eval": top1_eval,
            "command": " ".join(cmd)}


def print_table(a: argparse.Namespace, n: int, rows: List[Dict[str, Any]]) -> None:
    print(f"{'scenario':9} {'conds':>5} {'plain s':>8} {'evaluate s':>10} {'ratio':>6}   "
          f"{'plain start s':>13} {'ratio w/ starts':>15} {'eval run() s':>12} {'top-1 plain/eval (max |diff|)':>30}")
    for r in rows:
        diffs = [abs(r["top1_plain"][k] - r["top1_eval"].get(k, float("nan"))) for k in r["top1_plain"]]
        clean = f"{r['top1_plain']['clean@0.000000']:.1f}/{r['top1_eval'].get('clean@0.000000', float('nan')):.1f}"
        print(f"{r['scenario']:9} {r['conditions']:>5} {r['plain_work']:>8.2f} {r['eval_wall']:>10.2f} "
              f"{r['plain_work'] / r['eval_wall']:>6.3f}   {r['plain_wall'] - r['plain_work']:>13.2f} "
              f"{r['plain_wall'] / r['eval_wall']:>15.3f} "
              f"{r['eval_run']:>12.2f} {'clean ' + clean + f' ({max(diffs):.1f} pts)':>30}")
    print("ratio = plain s / evaluate s (target >= 0.9). plain s: model + ImageFolder + DataLoader + every batch, "
          "after its imports; plain start s: that process's interpreter start + imports (not in plain s); "
          "ratio w/ starts: both processes timed whole, start to exit (the same work for both). "
          "evaluate s: the whole command (start, imports, loading, run, tables); eval run() s: run.json "
          "wall_seconds (inside run()).")
    print(f"images decoded: once per image per scenario on both sides (evaluate holds each chunk of "
          f"samples on the device for all its conditions). n = {n} images.")


def main_timing(a: argparse.Namespace) -> None:
    from _common import machine

    tmp = Path(tempfile.mkdtemp(prefix="bench_e2e_"))
    try:
        tree = a.tree if a.tree is not None else tmp / "tree"
        t = time.perf_counter()
        if tree.is_dir() and any(tree.iterdir()):
            n = count_tree(tree)
            print(f"# reusing tree {tree}: {n} images, mean file {tree_stats(tree)[1]:.0f} KB")
        else:
            tree.mkdir(parents=True, exist_ok=True)
            build_tree(tree, a.n)
            n = count_tree(tree)
            print(f"# built tree {tree}: {n} JPEGs (quality 90, mean file {tree_stats(tree)[1]:.0f} KB) in "
                  f"{time.perf_counter() - t:.1f} s")
        ckpt = tmp / "pid_deit_tiny_random.pth"
        make_checkpoint(ckpt)
        # load the shared libraries and the package's bytecode once, so neither side pays a cold disk cache
        run_timed([sys.executable, "-c", "import torch, torchvision, timm, pandas, robustbench_pid.run.runner"])
        print(f"# bench_e2e: PID DeiT-tiny ({MODEL}, seeded random weights), 224 px, {n} images, batch "
              f"{a.batch_size}, workers {a.workers}, device {a.device}, precision {a.precision}, reps {a.reps}")
        if a.steps != PAPER_PGD_STEPS:
            print(f"# REDUCED: PGD steps {a.steps} instead of the paper's {PAPER_PGD_STEPS} (both sides)")
        print(f"# {machine()}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}")
        rows = []
        for s in a.scenarios:
            rows.append(time_scenario(a, s, tree, ckpt, tmp))
            r = rows[-1]
            print(f"#   {s}: plain {r['plain_work']:.2f} s, evaluate {r['eval_wall']:.2f} s", flush=True)
        print(f"# load average after: {os.getloadavg()[0]:.1f}")
        print_table(a, n, rows)
        print(f"evaluate command (last scenario): {rows[-1]['command']}")
    finally:
        if a.keep_tree:
            print(f"# kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- the Table 1 planning figure

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


def main(argv: Optional[Sequence[str]] = None) -> None:
    t_script = time.perf_counter()
    a = parse_args(argv)
    if a.plain_worker:
        print(json.dumps(plain_loop(json.loads(a.plain_worker), t_script)))
        return
    if a.tree is not None and a.tree.resolve().is_relative_to(REPO):
        fail(f"--tree {a.tree} is inside the repository; put the tree outside it (e.g. /tmp/e2e_tree)")
    (main_plan if a.plan_table1 else main_timing)(a)


if __name__ == "__main__":
    main()
