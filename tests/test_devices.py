"""Device independence: random draws come from a CPU generator whatever the device, a run's records
do not depend on the device's RNG, and GPU-only behaviour (bf16 attacks, automatic batch size,
``cuda:LOCAL_RANK``) is tested where CUDA is present (skipped, with the reason, elsewhere)."""
from __future__ import annotations

import os
import re

import pandas as pd
import pytest
import torch

from robustbench_pid.attacks import make_attack
from robustbench_pid.attacks.base import draw
from robustbench_pid.run.context import prepare, unit_seed
from robustbench_pid.run.runner import run
from robustbench_pid.specs import AttackSpec, RunSpec, Unit

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (this machine has none)")
KINDS = ("rand", "randn", "sign", "exponential")


def _draws(device: str, seed: int = 7) -> list:
    g = torch.Generator().manual_seed(seed)
    return [draw(k, (3, 4, 5), g, torch.device(device)) for k in KINDS]


@pytest.mark.parametrize("kind", KINDS)
def test_draw_comes_from_the_generator_not_the_device_argument(kind) -> None:
    """On the CPU: the drawn tensor is what the CPU generator gives, whatever device it is headed for
    (``meta`` stands for "another device": it holds no numbers, but takes the draw's shape and dtype)."""
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a = draw(kind, (2, 3, 8, 8), g1, torch.device("cpu"))
    m = draw(kind, (2, 3, 8, 8), g2, torch.device("meta"))
    assert m.device.type == "meta" and m.shape == a.shape and m.dtype == a.dtype
    assert torch.equal(g1.get_state(), g2.get_state())  # the same numbers were consumed either way
    assert torch.equal(a, draw(kind, (2, 3, 8, 8), torch.Generator().manual_seed(3), torch.device("cpu")))
    if kind == "sign":
        assert set(a.unique().tolist()) == {-1.0, 1.0}
    if kind == "exponential":
        assert (a > 0).all() and 0.8 < a.mean().item() < 1.2


def test_the_runner_hands_attacks_a_cpu_generator(tmp_path) -> None:
    ctx = prepare(RunSpec(model="deit", limit=4, device="cpu", out=tmp_path / "r"))
    u = Unit("adversarial", "pgd", 2 / 255, "{}", "", 0, 4, "k" * 64)
    g = ctx.generator(u)
    assert g.device.type == "cpu" and g.initial_seed() == unit_seed(u, 0)
    # the seed is what the unit does, not which model or which device
    assert unit_seed(u, 0) == unit_seed(Unit("adversarial", "pgd", 2 / 255, "{}", "", 0, 4, "other key"), 0)
    assert unit_seed(u, 0) != unit_seed(u, 1) != unit_seed(Unit("adversarial", "pgd", 2 / 255, "{}", "", 4, 8), 1)


@needs_cuda
def test_cpu_and_cuda_draws_are_identical() -> None:
    for a, b in zip(_draws("cpu"), _draws("cuda")):
        assert b.device.type == "cuda"
        assert torch.equal(a, b.cpu())


def _records(out) -> pd.DataFrame:
    return pd.read_parquet(out / "records.parquet")


@needs_cuda
def test_cpu_and_cuda_runs_differ_only_by_rounding(tmp_path) -> None:
    """Uniform noise is a pure draw: its perturbations are equal on both devices up to float rounding
    (they were not before, when the noise came from the device's own generator)."""
    attacks = [AttackSpec("noise", make_attack("noise", eps=8 / 255).params()),
               AttackSpec("pgd", make_attack("pgd", eps=2 / 255, steps=3).params())]
    base = dict(model="pid_deit", attacks=attacks, limit=32, batch_size=16, quiet=True)
    a = _records(run(RunSpec(out=tmp_path / "cpu", device="cpu", **base)))
    b = _records(run(RunSpec(out=tmp_path / "cuda", device="cuda", **base)))
    for col in ("pert_linf", "pert_l2", "pert_l1"):
        noise = a.attack == "noise"
        assert (a[col][noise] - b[col][noise]).abs().max() < 1e-4, col
    assert (a.clean_pred == b.clean_pred).mean() >= 0.97
    assert (a.correct_top1 == b.correct_top1).mean() >= 0.95


def test_bf16_attacks_keep_fp32_verdicts(tmp_path) -> None:
    """Both devices: CUDA autocast where there is a GPU, CPU autocast (bf16) elsewhere."""
    attacks = [AttackSpec("pgd", make_attack("pgd", eps=4 / 255, steps=5).params())]
    base = dict(model="pid_deit", attacks=attacks, limit=64, batch_size=32, quiet=True,
                device="cuda" if CUDA else "cpu")
    f32 = _records(run(RunSpec(out=tmp_path / "fp32", **base)))
    b16 = _records(run(RunSpec(out=tmp_path / "bf16", precision="bf16", **base)))
    clean = f32.attack == "clean"
    assert f32[clean].clean_pred.tolist() == b16[clean].clean_pred.tolist()  # verdicts outside autocast
    pgd = f32.attack == "pgd"
    # a half-precision attack is at most somewhat weaker: a few points on 64 samples
    assert abs(f32[pgd].correct_top1.mean() - b16[pgd].correct_top1.mean()) <= 0.1
    assert b16[pgd].correct_top1.mean() < b16[clean].correct_top1.mean()
    assert (b16[pgd].pert_linf <= 4 / 255 + 1e-6).all()


@needs_cuda
def test_auto_batch_size_on_gpu(tmp_path) -> None:
    ctx = prepare(RunSpec(model="pid_deit", batch_size=0, limit=8, device="cuda", out=tmp_path / "r"))
    bs = ctx.batch_size
    assert bs >= 16 and bs & (bs - 1) == 0  # a power of two from 16 up
    x = torch.rand((bs, 3, 32, 32), device=ctx.device, requires_grad=True)  # that batch really fits
    loss = ctx.model(x).float().logsumexp(1).sum()
    torch.autograd.grad(loss, x)


@needs_cuda
def test_local_rank_picks_the_gpu(monkeypatch) -> None:
    from robustbench_pid.runtime.device import pick_device
    from robustbench_pid.errors import UserError

    n = torch.cuda.device_count()
    monkeypatch.setenv("LOCAL_RANK", str(n - 1))
    assert pick_device("auto") == torch.device("cuda", n - 1)
    monkeypatch.setenv("LOCAL_RANK", str(n))
    with pytest.raises(UserError, match=f"this machine has {n}"):
        pick_device("auto")
    monkeypatch.delenv("LOCAL_RANK")
    torch.cuda.set_device(0)
    assert os.environ.get("LOCAL_RANK") is None and pick_device("auto").type == "cuda"


def _device_numbers():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docs" / "device_numbers.py"
    spec = importlib.util.spec_from_file_location("device_numbers", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_gpu_runs_agree_with_the_cpu_reference_runs() -> None:
    """Any machine, on the committed runs a lent GPU made (docs/runs/devices/): every condition set beside its
    CPU run agrees on at least 98% of the samples (docs/attacks.md's precision agreement), and every
    ``--converge`` condition has the same ladder status on both devices where both cut it into the same work
    units (the stop rule is applied per unit, then to the whole condition; with other units the same verdicts
    may meet it differently, and the table says so): the GPU's verdicts are the CPU's up to rounding."""
    dn = _device_numbers()
    runs = list(dn.device_runs())
    assert runs, "no committed GPU run under docs/runs/devices/"
    converged = 0
    for run_dir, cpu_dir in runs:
        assert cpu_dir.is_dir(), f"{run_dir}: its CPU counterpart {cpu_dir} is missing"
        rows = dn.agreement(run_dir, cpu_dir)
        assert rows, run_dir
        for r in rows:
            assert r["n"] == 360 and r["differ"] <= 0.02 * r["n"], (run_dir, r)
            if r["status"]:
                cpu_status, gpu_status = r["status"].split(" / ")
                if cpu_status != gpu_status:  # only where the work units were cut differently, with equal verdicts
                    sizes = re.findall(r"\((\d+)-sample units\)", r["why"])
                    assert r["differ"] == 0 and len(sizes) == 2 and sizes[0] != sizes[1], (run_dir, r)
                converged += 1
    assert converged >= 2  # both embedded DeiTs' ladders ran on the GPU
    # a condition whose units were cut differently (other random starts) is not counted as a device comparison
    bench = [a for r, c in runs if r.parent.name == "converge" for a in dn.agreement(r, c)]
    assert bench and all(a["condition"].startswith("converge") for a in bench)
