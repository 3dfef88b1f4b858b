"""``--compile``: every benchmark and protocol runs with a compiled model (a compiled module is never
tested for truth), and on the CPU with inductor the verdicts equal eager ones.

The real inductor compile costs minutes on a busy 2-core machine, so it runs once, on a tiny
workload; the per-benchmark runs use torch.compile's ``eager`` backend, which wraps the model in the
same OptimizedModule (what broke ``ctx.eval_model or ctx.model``) without generating code.
"""
from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd
import pytest
import torch

from robustbench_pid.attacks import make_attack
from robustbench_pid.run.context import prepare
from robustbench_pid.run.runner import run
from robustbench_pid.specs import AttackSpec, RunSpec

# what a record says about the model's behaviour (identity and timing columns left out)
RESULT_COLS = ["sample_id", "attack", "eps", "condition", "label", "clean_pred", "clean_correct_top1",
               "clean_correct_top5", "pred", "correct_top1", "correct_top5", "attacked", "layer", "value",
               "pert_linf", "pert_l2", "pert_l1"]

pytestmark = pytest.mark.usefixtures("one_thread")


def _records(out: Path) -> pd.DataFrame:
    df = pd.read_parquet(out / "records.parquet")
    return df[[c for c in RESULT_COLS if c in df.columns]]


@pytest.fixture
def eager_backend(monkeypatch):
    """torch.compile with the eager backend: the compiled-module wrapper, none of the code generation."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", functools.partial(real, backend="eager"))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_models_are_used_and_the_callers_stay_eager(tmp_path, eager_backend) -> None:
    ctx = prepare(RunSpec(model="pid_deit", compile=True, limit=4, device="cpu", out=tmp_path / "r"))
    from torch._dynamo.eval_frame import OptimizedModule

    assert isinstance(ctx.verdict_model(), OptimizedModule) and isinstance(ctx.attacked_model(), OptimizedModule)
    assert isinstance(ctx.attacked_net(), OptimizedModule)
    assert ctx.verdict_model()._orig_mod is ctx.model and ctx.attacked_net()._orig_mod is ctx.model.net
    plain = prepare(RunSpec(model="pid_deit", limit=4, device="cpu", out=tmp_path / "r"))
    assert plain.verdict_model() is plain.model and plain.attacked_net() is plain.model.net


class _Counting(torch.nn.Module):
    """Stands in for torch.compile's wrapper and counts the calls it serves, by grad mode."""

    made: list = []

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.grad_calls, self.no_grad_calls = inner, 0, 0
        _Counting.made.append(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            self.grad_calls += 1
        else:
            self.no_grad_calls += 1
        return self.inner(x)


@pytest.mark.parametrize("protocol", ["standard", "paper"])
def test_the_attack_differentiates_the_compiled_model(tmp_path, monkeypatch, protocol) -> None:
    """--compile reaches the attack's gradient passes, not only the verdicts: every PGD step goes
    through the compiled model (one compile per process, shared by every condition)."""
    _Counting.made = []
    monkeypatch.setattr(torch, "compile", lambda m, **_: _Counting(m))
    pgd = AttackSpec("pgd", make_attack("pgd", eps=4 / 255, steps=3, early_stop=False).params())
    run(RunSpec(model="pid_deit", attacks=[_FGSM, pgd], limit=8, batch_size=8, quiet=True, device="cpu",
                protocol=protocol, compile=True, out=tmp_path / "r"))
    assert len(_Counting.made) == 2  # the model and, for the paper protocol, its un-normalized network
    grad_calls = sum(c.grad_calls for c in _Counting.made)
    assert grad_calls == 1 + 3  # FGSM: one gradient; PGD-3: three (one batch of 8)
    assert sum(c.no_grad_calls for c in _Counting.made) >= 3  # clean pass + a verdict per condition


_PGD = AttackSpec("pgd", make_attack("pgd", eps=4 / 255, steps=2).params())
_FGSM = AttackSpec("fgsm", make_attack("fgsm", eps=4 / 255).params())


@pytest.mark.parametrize("protocol", ["standard", "paper"])
def test_adversarial_compiled_equals_eager(tmp_path, eager_backend, protocol) -> None:
    base = dict(model="pid_deit", attacks=[_FGSM, _PGD], limit=12, batch_size=8, chunk_size=8, quiet=True,
                device="cpu", protocol=protocol)
    a = _records(run(RunSpec(out=tmp_path / "eager", **base)))
    b = _records(run(RunSpec(out=tmp_path / "compiled", compile=True, **base)))
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert set(a.attack) == {"clean", "fgsm", "pgd"} and (a.pert_linf[a.attack == "pgd"] > 0).any()
    if protocol == "standard":  # the attack did something the verdicts show
        assert a.correct_top1[a.attack == "pgd"].sum() < a.correct_top1[a.attack == "clean"].sum()


def test_digits_benchmarks_run_compiled(tmp_path, eager_backend) -> None:
    for bench, opts in (("rank-collapse", {}), ("corruptions", {"corruptions": {"corruptions": ["fog"], "severities": [1]}})):
        base = dict(model="deit", benchmark=bench, limit=6, batch_size=4, quiet=True, device="cpu",
                    benchmark_options=opts)
        a = _records(run(RunSpec(out=tmp_path / f"{bench}-eager", **base)))
        b = _records(run(RunSpec(out=tmp_path / f"{bench}-compiled", compile=True, **base)))
        pd.testing.assert_frame_equal(a, b, check_exact=True)
        assert len(a) >= 6


def test_imagenet_benchmarks_run_compiled(tmp_path, eager_backend) -> None:
    from safetensors.torch import save_file

    from robustbench_pid.core.imagenet_info import imagenet_wnids, subset_wnids
    from robustbench_pid.models.zoo import build_model
    from test_imagenet_datasets import _imagenet_c_tree, tree

    torch.manual_seed(0)
    ckpt = tmp_path / "test_vit.safetensors"
    save_file({k: v.contiguous() for k, v in build_model("test_vit", num_classes=1000).state_dict().items()}, str(ckpt))
    wn = imagenet_wnids()
    tree(tmp_path / "r", [subset_wnids("r")[i] for i in (0, 9)], per=2, ext=".jpg", size=(40, 30))
    o = subset_wnids("o")
    tree(tmp_path / "o", [o[0]], per=4, size=(12, 12))
    tree(tmp_path / "in", list(o), per=1, size=(8, 8))
    _imagenet_c_tree(tmp_path / "c", [wn[3]], per=1, corruptions=["fog"], category=False)
    tree(tmp_path / "val", [wn[3]], per=1, size=(240, 240))
    cases = [("imagenet-r", "restricted", tmp_path / "r", None, {}),
             ("imagenet-o", "ood", tmp_path / "o", 12, {"dataset": {"imagenet_root": str(tmp_path / "in")}}),
             ("imagenet-c", "imagenet_c", tmp_path / "c", None,
              {"dataset": {"corruptions": ["fog"], "imagenet_root": str(tmp_path / "val")}})]
    for dataset, bench, root, subset, opts in cases:
        base = dict(model="timm:test_vit", checkpoint=str(ckpt), dataset=dataset, data_root=str(root),
                    benchmark=bench, batch_size=4, quiet=True, device="cpu", subset=subset, benchmark_options=opts)
        a = _records(run(RunSpec(out=tmp_path / f"{bench}-eager", **base)))
        b = _records(run(RunSpec(out=tmp_path / f"{bench}-compiled", compile=True, **base)))
        pd.testing.assert_frame_equal(a, b, check_exact=True)
        assert len(a) >= 2, bench


def test_inductor_verdicts_equal_eager_on_cpu(tmp_path) -> None:
    """The real thing on the CPU: inductor-generated kernels (compiled once per run and reused by
    every unit and batch size), verdicts identical to eager, perturbations equal to rounding."""
    torch._dynamo.reset()
    # PGD without early stopping: every step has the batch's shape, so nothing recompiles (time)
    pgd = AttackSpec("pgd", make_attack("pgd", eps=4 / 255, steps=2, early_stop=False).params())
    base = dict(model="pid_deit", attacks=[_FGSM, pgd], limit=8, batch_size=8, quiet=True, device="cpu")
    a = pd.read_parquet(run(RunSpec(out=tmp_path / "eager", **base)) / "records.parquet")
    b = pd.read_parquet(run(RunSpec(out=tmp_path / "compiled", compile=True, **base)) / "records.parquet")
    for col in ("clean_pred", "pred", "correct_top1", "correct_top5", "attacked"):
        assert a[col].tolist() == b[col].tolist(), col
    adv = a.attack != "clean"
    assert (a.pert_linf[adv] - b.pert_linf[adv]).abs().max() < 1e-5
    assert a.correct_top1[a.attack == "pgd"].mean() < a.correct_top1[a.attack == "clean"].mean()
    run_json = pd.read_json(tmp_path / "compiled" / "run.json", typ="series")
    assert bool(run_json["compile"]) is True
    torch._dynamo.reset()
