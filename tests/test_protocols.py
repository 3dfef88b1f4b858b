"""The two protocols through the real runner: what the attack is handed (space, labels, box), what
is recorded, and that skipping already-misclassified samples leaves the accuracy unchanged."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar, List

import pandas as pd
import pytest
import torch

from robustbench_pid.attacks import attacks, make_attack
from robustbench_pid.attacks.base import Attack
from robustbench_pid.benchmarks.adversarial import PAPER_PGD_STEP_FACTOR, protocol_params
from robustbench_pid.run.runner import run
from robustbench_pid.specs import AttackSpec, RunSpec


@dataclass
class _Spy(Attack):
    """Records what the benchmark hands an attack; perturbs by FGSM so the run is meaningful."""

    name = "_test_protocol_spy"
    norm = "linf"
    calls: ClassVar[List[dict]] = []

    eps: float = 3 / 255

    def perturb(self, model, x, y, bounds, generator):
        _Spy.calls.append({"x": x.clone(), "y": y.clone(), "bounds": bounds, "model": model})
        grad, _ = self.input_grad(model, x, y)
        out = x + self.eps * grad.sign()
        return out if bounds is None else out.clamp(*bounds)


@pytest.fixture(scope="module", autouse=True)
def _spy_registered():
    """Registered only while this module runs, so no other test sees the spy."""
    if "_test_protocol_spy" not in attacks.names():
        attacks.add("_test_protocol_spy", _Spy)
    yield
    attacks._items.pop("_test_protocol_spy", None)


def _run(tmp_path, protocol, attacks_, limit=24, name="r", model="deit"):
    # on the CPU, explicitly: the tests compare the run's tensors and verdicts with the CPU fixtures
    spec = RunSpec(model=model, protocol=protocol, attacks=attacks_, limit=limit, out=tmp_path / name,
                   quiet=True, batch_size=64, device="cpu")
    out = run(spec)
    return pd.read_parquet(out / "records.parquet"), pd.read_csv(out / "summary.csv")


@pytest.fixture(scope="module")
def spy_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("proto")
    res = {}
    for protocol in ("standard", "paper"):
        _Spy.calls.clear()
        recs, summ = _run(tmp, protocol, [AttackSpec("_test_protocol_spy", {"eps": 3 / 255})], name=protocol)
        res[protocol] = (recs, summ, list(_Spy.calls))
    return res


def test_paper_protocol_attacks_normalized_unclipped_with_model_labels(spy_runs, deit_model, digits_test):
    recs, summ, calls = spy_runs["paper"]
    call = calls[0]
    n = len(call["x"])
    assert n == 24  # every sample attacked, none skipped
    x, y_true = digits_test.images[:n], digits_test.labels[:n]
    assert call["bounds"] is None
    assert not hasattr(call["model"], "normalize")  # the network without its normalization layer
    assert type(call["model"]) is type(deit_model.net)
    assert torch.allclose(call["x"], deit_model.normalize(x))  # normalized tensors, not pixels
    with torch.no_grad():
        preds = deit_model(x).argmax(1)
    assert torch.equal(call["y"], preds)  # the model's own clean predictions ...
    assert preds[15] != y_true[15] and call["y"][15] != y_true[15]  # ... also where they are wrong
    adv = recs[recs.attack == "_test_protocol_spy"]
    # eps in normalized units: a pixel-space change of eps * std = 3/255 * 0.5, never clipped
    assert (adv.pert_linf - 3 / 255 * 0.5).abs().max() < 1e-6
    assert adv.attacked.all()
    # scored against the true labels, as plain accuracy
    assert (adv.correct_top1.to_numpy() == (adv.pred.to_numpy() == adv.label.to_numpy())).all()


def test_standard_protocol_pixels_true_labels_clipped(spy_runs, digits_test):
    recs, summ, calls = spy_runs["standard"]
    call = calls[0]
    assert call["bounds"] == (0.0, 1.0)
    assert call["x"].min() >= 0 and call["x"].max() <= 1
    clean = recs[recs.attack == "clean"]
    attacked = clean[clean.clean_correct_top5]
    assert len(call["x"]) == len(attacked)  # only clean-top-5-correct samples are attacked
    assert torch.equal(call["y"], torch.tensor(attacked.label.to_numpy()))  # true labels
    adv = recs[recs.attack == "_test_protocol_spy"]
    assert adv.pert_linf.max() <= 3 / 255 + 1e-6
    # sample 15 is misclassified clean: not robust under attack, whatever the attack did
    assert not adv[adv.sample_id == clean.sample_id.iloc[15]].correct_top1.iloc[0]
    # clipping: digits have many 0 pixels, so the L1 change is below eps * d; the unclipped paper
    # perturbation (eps * std per pixel) moves nearly every pixel
    d = 3 * 32 * 32
    assert (adv.pert_l1 < 3 / 255 * d - 1).all()
    paper = spy_runs["paper"][0]
    paper = paper[paper.attack == "_test_protocol_spy"]
    assert (paper.pert_l1 > 0.9 * 3 / 255 * 0.5 * d).all()


def test_protocol_changes_recorded_field_and_summary(spy_runs):
    for protocol in ("standard", "paper"):
        recs, summ, _ = spy_runs[protocol]
        assert set(summ.protocol) == {protocol}
        assert set(recs.protocol) == {protocol}


def test_paper_protocol_settings():
    p = protocol_params("pgd", make_attack("pgd", eps=3 / 255).params(), "paper")
    assert p["step_size_factor"] == PAPER_PGD_STEP_FACTOR and p["early_stop"] is False
    assert p["random_start"] is True and p["steps"] == 20
    s = protocol_params("pgd", make_attack("pgd", eps=3 / 255).params(), "standard")
    assert s["step_size_factor"] is None and s["early_stop"] is True
    explicit = protocol_params("pgd", make_attack("pgd", step_size=0.001).params(), "paper")
    assert explicit["step_size"] == 0.001 and explicit["step_size_factor"] is None
    spsa = protocol_params("spsa", make_attack("spsa").params(), "paper")
    assert spsa["early_stop"] is False
    assert (spsa["eps"], spsa["iterations"], spsa["lr"], spsa["fd_delta"], spsa["n_samples"]) == (0.1, 40, 0.01, 0.01, 128)
    sld = make_attack("sld").params()
    assert (sld["eps"], sld["step_size"], sld["iterations"], sld["q"]) == (10.0, 1.0, 20, 99.0)
    assert make_attack("noise").eps == 0.3 and make_attack("fgsm").eps == 3 / 255


def test_skipping_misclassified_samples_keeps_accuracy(tmp_path, deit_model, digits_test):
    """Deterministic attacks (FGSM; PGD without random start) on every sample, scored as the worst
    case, give exactly the runner's per-sample verdicts (it attacks only clean-correct samples)."""
    n = 24  # contains sample 15, which deit gets wrong
    specs = [AttackSpec("fgsm", {"eps": 4 / 255}),
             AttackSpec("pgd", make_attack("pgd", eps=4 / 255, steps=5, random_start=False).params())]
    recs, summ = _run(tmp_path, "standard", specs, limit=n)
    x, y = digits_test.images[:n], digits_test.labels[:n]
    with torch.no_grad():
        clean = deit_model(x)
    assert (clean.argmax(1) != y).sum() >= 1
    for spec in specs:
        xa = make_attack(spec.attack, **spec.params)(deit_model, x, y)
        with torch.no_grad():
            adv = deit_model(xa)
        top1 = ((clean.argmax(1) == y) & (adv.argmax(1) == y)).numpy()
        r = recs[recs.attack == spec.attack]
        assert r.correct_top1.to_numpy().tolist() == top1.tolist()
        acc = summ[(summ.attack == spec.attack) & (summ.metric == "top1")].value.iloc[0]
        assert acc == pytest.approx(100 * top1.mean())
