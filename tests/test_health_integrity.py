"""Numbers behind the issue-15 checks: NaN detection counts, its reach into every benchmark,
the broken-model / motionless-attack findings, and the architecture-argument lists."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from robustbench_pid.results.report.diagnostics import check_attack_moved, check_constant_predictions, diagnose
from robustbench_pid.runtime.health import NonFiniteError, check_finite
from robustbench_pid.specs import Unit


def _ctx(model: str = "m") -> SimpleNamespace:
    return SimpleNamespace(spec=SimpleNamespace(model=model))


def test_check_finite_counts_bad_samples_not_elements():
    t = torch.zeros(5, 10)
    t[1, :4] = float("nan")  # one sample, four bad logits
    t[3, 7] = float("inf")
    u = Unit("adversarial", "pgd", 2 / 255, "{}", "", 16, 21, "k" * 64)
    with pytest.raises(NonFiniteError) as e:
        check_finite(t, _ctx("pid_deit"), u, "verdict")
    msg = str(e.value)
    assert "model 'pid_deit' gave non-finite logits (NaN/inf) for 2 of 5 samples" in msg
    assert "verdict pass" in msg and "adversarial/pgd eps=2/255, samples [16:21]" in msg
    check_finite(torch.randn(4, 3), _ctx(), u, "clean")  # finite: nothing happens


def _nan_ckpt(tmp_path: Path, arch_model: str, dataset: str = "digits") -> str:
    from safetensors.torch import save_file

    from robustbench_pid import load_model

    if arch_model.startswith("timm:"):
        from robustbench_pid.models.zoo import build_model

        torch.manual_seed(0)
        sd = build_model(arch_model[5:], num_classes=1000).state_dict()
    else:
        sd = load_model(arch_model, dataset=dataset).net.state_dict()
    sd = {k: v.clone().contiguous() for k, v in sd.items()}
    sd["blocks.0.mlp.fc1.weight"][0, 0] = float("nan")
    path = tmp_path / "nan.safetensors"
    save_file(sd, str(path))
    return str(path)


# "which", not "benchmark": pytest-benchmark (installed on many GPU images) owns a fixture of that name
@pytest.mark.parametrize("which", ["corruptions", "rank-collapse", "restricted"])
def test_nan_stops_every_benchmark(which, tmp_path):
    from robustbench_pid.run.runner import run
    from robustbench_pid.specs import RunSpec

    kw = dict(out=tmp_path / "run", quiet=True, benchmark=which, limit=6, batch_size=6)
    if which == "restricted":
        from test_imagenet_datasets import tree

        from robustbench_pid.core.imagenet_info import subset_wnids

        tree(tmp_path / "r", subset_wnids("r")[:3], per=2, size=(24, 24))
        spec = RunSpec(model="timm:test_vit", checkpoint=_nan_ckpt(tmp_path, "timm:test_vit"), dataset="imagenet-r",
                       data_root=str(tmp_path / "r"), **kw)
    else:
        opts = {"corruptions": {"corruptions": ["fog"], "severities": [1]}} if which == "corruptions" else {}
        spec = RunSpec(model="deit", checkpoint=_nan_ckpt(tmp_path, "deit"), benchmark_options=opts, **kw)
    with pytest.raises(NonFiniteError, match=rf"model '.*' gave non-finite logits \(NaN\) for 6 of 6 samples "
                                             rf"in the clean pass .* of {which.replace('-', '.')}/"):
        run(spec)
    assert not (tmp_path / "run" / "summary.csv").exists()


def _records(preds, labels, attack="clean", eps=0.0, **cols) -> pd.DataFrame:
    n = len(preds)
    return pd.DataFrame({"run_id": "r", "model": "m", "checkpoint_sha256": "c", "dataset": "digits",
                         "protocol": "standard", "benchmark": "adversarial", "attack": attack, "eps": eps,
                         "sample_id": [f"s{i}" for i in range(n)], "label": labels, "clean_pred": preds, **cols})


def test_constant_predictions_finding():
    labels = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    (f,) = check_constant_predictions(_records([3] * 10, labels))
    assert f.code == "constant-predictions" and f.severity == "error" and f.value == 10
    assert "all 10 samples are predicted as class 3 although their labels span 10 classes" in f.message
    assert check_constant_predictions(_records([3] * 9 + [4], labels)) == []  # one sample differs: alive
    assert check_constant_predictions(_records([3] * 10, [3] * 10)) == []  # one-class data proves nothing
    assert check_constant_predictions(_records([3] * 4, [0, 1, 2, 3])) == []  # too few samples to say


def test_attack_moved_nothing_finding():
    base = dict(attacked=[True, True, True, False], pert_l2=[0.0] * 4, pert_l1=[0.0] * 4)
    still = _records([0, 1, 2, 3], [0, 1, 2, 3], attack="fgsm", eps=4 / 255, pert_linf=[0.0, 0.0, 0.0, 0.0], **base)
    (f,) = check_attack_moved(still)
    assert f.code == "attack-moved-nothing" and f.value == 3 and f.eps == pytest.approx(4 / 255)
    assert "left all 3 attacked samples unchanged" in f.message
    moved = still.assign(pert_linf=[0.0, 4 / 255, 0.0, 0.0])
    assert check_attack_moved(moved) == []  # one sample moved: the attack works
    assert check_attack_moved(still.assign(eps=0.0)) == []  # eps 0 is meant to move nothing
    codes = {f.code for f in diagnose(pd.concat([_records([3] * 10, list(range(10))), still]))}
    assert {"constant-predictions", "attack-moved-nothing"} <= codes


def test_factory_kwargs_are_what_the_factories_consume():
    from robustbench_pid.models.pid_vit import PidGains, PidVisionTransformer
    from robustbench_pid.models.symvit import RPC_FIELDS, RpcConfig, SymVisionTransformer

    assert PidVisionTransformer.factory_kwargs == tuple(f.name for f in dataclasses.fields(PidGains))
    assert SymVisionTransformer.factory_kwargs == RPC_FIELDS == tuple(f.name for f in dataclasses.fields(RpcConfig))


def test_valid_arch_kwargs_still_load():
    from robustbench_pid import load_model
    from robustbench_pid.errors import UserError

    m = load_model("pid_deit", lambda_p=0.5, first_derivative="none", drop_rate=0.0)
    assert m.info["arch_kwargs"]["pid"]["lambda_p"] == 0.5
    with pytest.raises(UserError, match="first_derivative must be 'zero-error' or 'none'"):
        load_model("pid_deit", first_derivative="bogus")
