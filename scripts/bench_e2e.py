"""End to end: the ``evaluate`` command against a plain loop doing the same work on the same JPEGs.

Builds (in a temp folder outside the repository, or ``--tree DIR``) an ImageNet-validation tree of
N JPEGs (real wnids, 500x375 / 500x333 / 375x500 / 333x500, varied content, quality 90) and a
seeded random-init PID DeiT-tiny checkpoint (no pretrained weights are needed or downloaded), then
times, side by side in one run of this script, per scenario:

  evaluate  ``python -m robustbench_pid evaluate --model pid_deit --checkpoint CK --dataset imagenet
            --data-root TREE --protocol paper ...`` as a subprocess: the whole command a user pays,
            interpreter start, imports, model and data loading, run folder and tables included.
  plain     ``scripts/e2e_plain.py`` as a subprocess: torchvision ImageFolder + DataLoader (same batch,
            workers and transform: Resize(floor(224 / 0.875) = 256, bicubic, antialias) + CenterCrop(224) +
            ToTensor, normalization inside the model) + the same model + the project's attack
            classes with the paper-protocol settings, top-1 counted on the device. Its time runs
            from after its imports to the last batch; its interpreter start + imports are printed
            separately.

Axes: ``--decode cpu,gpu`` (a row per scenario and decoder: ``evaluate --decode gpu`` against a plain loop that
decodes with ``torchvision.io.decode_jpeg`` on the GPU; gpu is skipped without CUDA, saying so), ``--precision``
and ``--compile`` (both sides). ``--json FILE`` writes the rows.

Scenarios: ``clean`` (decode + forward), ``pgd`` (one PGD-20 at 3/255, paper protocol: 0.15*eps
steps, random start, every sample attacked, no early stop), ``sweep`` (FGSM and PGD at 1..6/255, 12
conditions; the plain loop decodes each image once and applies all 12 to each batch).

    ratio = plain seconds / evaluate seconds  (throughput of evaluate relative to the plain loop; target >= 0.9)

    python scripts/bench_e2e.py --n 32 --batch-size 16 --workers 1 --steps 3     # CPU smoke (reduced PGD)
    python scripts/bench_e2e.py --n 5000 --batch-size 256 --workers 14           # one GPU, paper settings
    python scripts/bench_e2e.py --n 1024 --decode cpu,gpu --precision bf16 --compile --json e2e.json  # one GPU

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
    ap.add_argument("--decode", default="cpu", help="comma-separated decoders, cpu and/or gpu (gpu: CUDA only; skipped "
                                                    "without it, saying so)")
    ap.add_argument("--compile", action="store_true", help="torch.compile on both sides (evaluate --compile)")
    ap.add_argument("--json", type=Path, help="also write the rows (and the settings) to this file")
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
    a = ap.parse_args(argv)
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
    a.decode = [d.strip() for d in a.decode.split(",") if d.strip()]
    if not a.decode or any(d not in ("cpu", "gpu") for d in a.decode):
        fail(f"--decode {','.join(a.decode) or '(none given)'}: give cpu, gpu or cpu,gpu")
    a.skipped = []
    if "gpu" in a.decode and not cuda and not a.plan_table1:
        a.skipped.append("--decode gpu: no CUDA device here (evaluate refuses it without one); its rows are not "
                         "measured")
        a.decode = [d for d in a.decode if d != "gpu"]
        if not a.decode:
            fail("--decode gpu needs a CUDA device (torch.cuda.is_available() is False); add cpu or run on a GPU")
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


def evaluate_cmd(a: argparse.Namespace, tree: Path, ckpt: Path, suite: Optional[Path], out: Path,
                 decode: str = "cpu") -> List[str]:
    cmd = [sys.executable, "-m", "robustbench_pid", "evaluate", "--model", MODEL, "--checkpoint", str(ckpt),
           "--dataset", "imagenet", "--data-root", str(tree), "--protocol", "paper",
           "--batch-size", str(a.batch_size), "--workers", str(a.workers), "--device", a.device,
           "--precision", a.precision, "--quiet", "--out", str(out)]
    cmd += ["--decode", decode] if decode != "cpu" else []
    cmd += ["--compile"] if getattr(a, "compile", False) else []
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


# --------------------------------------------------------------------------- timing

def time_scenario(a: argparse.Namespace, scenario: str, tree: Path, ckpt: Path, work: Path,
                  decode: str = "cpu") -> Dict[str, Any]:
    conds = conditions(scenario, a.steps)
    suite = None
    if conds:
        suite = work / f"{scenario}.toml"
        write_suite(suite, conds)
    cfg = {"device": a.device, "checkpoint": str(ckpt), "tree": str(tree), "batch_size": a.batch_size,
           "workers": a.workers, "precision": a.precision, "conditions": conds, "decode": decode,
           "compile": a.compile}
    plain_cmd = [sys.executable, str(Path(__file__).resolve().parent / "e2e_plain.py"), json.dumps(cfg)]
    res: Dict[str, List[float]] = {"plain_wall": [], "plain_work": [], "eval_wall": [], "eval_run": []}
    top1_plain: Dict[str, float] = {}
    top1_eval: Dict[str, float] = {}
    for rep in range(a.reps):
        wall, stdout = run_timed(plain_cmd)
        got = json.loads(stdout.strip().splitlines()[-1])
        res["plain_wall"].append(wall)
        res["plain_work"].append(got["work_s"])
        top1_plain = got["top1"]
        out = work / f"run_{scenario}_{decode}_{rep}"
        cmd = evaluate_cmd(a, tree, ckpt, suite, out, decode)
        wall, _ = run_timed(cmd)
        res["eval_wall"].append(wall)
        res["eval_run"].append(float(json.loads((out / "run.json").read_text())["wall_seconds"]))
        top1_eval = evaluate_top1(out)
        shutil.rmtree(out)
    m = {k: statistics.median(v) for k, v in res.items()}
    return {"scenario": scenario, "decode": decode, "conditions": len(conds), **m, "top1_plain": top1_plain,
            "top1_eval": top1_eval, "command": " ".join(cmd)}


def print_table(a: argparse.Namespace, n: int, rows: List[Dict[str, Any]]) -> None:
    print(f"{'scenario':9} {'decode':6} {'conds':>5} {'plain s':>8} {'evaluate s':>10} {'ratio':>6}   "
          f"{'plain start s':>13} {'ratio w/ starts':>15} {'eval run() s':>12} {'top-1 plain/eval (max |diff|)':>30}")
    for r in rows:
        diffs = [abs(r["top1_plain"][k] - r["top1_eval"].get(k, float("nan"))) for k in r["top1_plain"]]
        clean = f"{r['top1_plain']['clean@0.000000']:.1f}/{r['top1_eval'].get('clean@0.000000', float('nan')):.1f}"
        print(f"{r['scenario']:9} {r['decode']:6} {r['conditions']:>5} {r['plain_work']:>8.2f} {r['eval_wall']:>10.2f} "
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


def write_json(a: argparse.Namespace, n: int, rows: List[Dict[str, Any]], where: str) -> None:
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"script": "scripts/bench_e2e.py", "machine": where, "n": n,
                                      "batch_size": a.batch_size, "workers": a.workers, "device": a.device,
                                      "precision": a.precision, "compile": a.compile, "steps": a.steps,
                                      "skipped": a.skipped, "rows": rows}, indent=1))


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
              f"{a.batch_size}, workers {a.workers}, device {a.device}, precision {a.precision}"
              f"{' + compile' if a.compile else ''}, decode {','.join(a.decode)}, reps {a.reps}")
        for why in a.skipped:
            print(f"# SKIPPED: {why}")
        if a.steps != PAPER_PGD_STEPS:
            print(f"# REDUCED: PGD steps {a.steps} instead of the paper's {PAPER_PGD_STEPS} (both sides)")
        print(f"# {machine()}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}")
        rows: List[Dict[str, Any]] = []
        for s in a.scenarios:
            for d in a.decode:
                rows.append(time_scenario(a, s, tree, ckpt, tmp, d))
                r = rows[-1]
                print(f"#   {s} ({d} decode): plain {r['plain_work']:.2f} s, evaluate {r['eval_wall']:.2f} s", flush=True)
                write_json(a, n, rows, machine())  # after every row: a run stopped at a time limit keeps its rows
        print(f"# load average after: {os.getloadavg()[0]:.1f}")
        print_table(a, n, rows)
        print(f"evaluate command (last scenario): {rows[-1]['command']}")
    finally:
        if a.keep_tree:
            print(f"# kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Optional[Sequence[str]] = None) -> None:
    a = parse_args(argv)
    if a.tree is not None and a.tree.resolve().is_relative_to(REPO):
        fail(f"--tree {a.tree} is inside the repository; put the tree outside it (e.g. /tmp/e2e_tree)")
    if a.plan_table1:
        from e2e_plan import main_plan  # the Table 1 planning figure lives apart (scripts/e2e_plan.py)

        main_plan(a)
        return
    main_timing(a)


if __name__ == "__main__":
    main()
