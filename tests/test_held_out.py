"""The held-out set of issue 63 (scripts/held_out.py): its rules and table on hand-made records, the training
objectives of its recipes on inputs small enough to check by hand, a deterministic short training, and that
docs/held_out.md's block is the rendering of the committed records."""
from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
import pytest
import torch

from robustbench_pid.errors import UserError
from robustbench_pid.train import objectives as obj
from robustbench_pid.train.recipes import CNN_AT, HELD_OUT, HELD_OUT_EPS, Adversarial

from script_loader import load_script  # noqa: E402


_script = load_script


doc = _script("held_out_doc")
external_doc = _script("external_doc")


def _joined(ladder, aa, status, probe=(), draws=(), fwd=10.0, bwd=5.0):
    """A hand-made ``external_doc.load`` result: per-sample verdicts of both sides, AutoAttack's passes 100 / 50
    forward / backward per sample, the ladder's ``fwd`` / ``bwd``."""
    n = len(ladder)
    ids = list(range(n))
    samples = pd.DataFrame({"sample_id": ids, "ladder_robust": ladder, "aa_robust": aa,
                            "ladder_broken_by": ["" if r else "apgd-t" for r in ladder],
                            "aa_broken_by": ["" if r else "square" for r in aa]})
    c = pd.DataFrame({"correct_top1": ladder, "passes_forward": [fwd] * n, "passes_backward": [bwd] * n,
                      "margin_gradient": [0.25] * n, "margin_free": [0.5] * n,
                      "converge_grad_misleads": [i in probe for i in ids],
                      "converge_random_gradients": [i in draws for i in ids],
                      "converge_untrusted": [False] * n}, index=pd.Index(ids, name="sample_id"))
    aa_info = {"eps": 0.1, "forward_rows": 100 * n, "backward_rows": 50 * n, "what": "hand-made",
               "per_attack": {"apgd-ce": {"broke": 1}, "square": {"broke": 0}}}
    return {"samples": samples, "aa": aa_info, "conv": {"design": 10}, "converge_records": c, "status": status,
            "detail": "d", "comparison": external_doc.compare(samples, status)}


def test_a_row_reads_values_ratios_misses_and_probe_flags_from_the_records() -> None:
    # 4 samples: the ladder leaves 0, 1, 2 robust; AutoAttack leaves 0 and 3: sample 1 and 2 it broke, the ladder not
    r = doc.row_of("cnn_trades", _joined([True, True, True, False], [True, False, False, True], "not converged",
                                         probe=(3,), draws=(0, 1)))
    assert (r.n, r.ladder, r.autoattack, r.ladder_only) == (4, 75.0, 50.0, [1, 2])
    assert (r.bwd_ratio, r.fwd_ratio, r.design, r.step_probe, r.two_draws) == (0.1, 0.1, 10, 1, 2)
    assert r.eps == "32/255" and r.source == "hand-made"
    assert "broken by square 2" in r.detail and "1: 0.25 / 0.5" in r.detail
    assert doc.problems_of(r) == ["cnn_trades: 75.00% is 25.00 pt above AutoAttack (> 0.5)"]


def test_each_rule_breaks_alone() -> None:
    ok = doc.row_of("cnn_mart", _joined([True] * 4, [True] * 4, "converged"))
    assert doc.problems_of(ok) == []
    # one sample of 200 above AutoAttack: 0.5 pt, inside the slack, but a converged status may not sit above it
    above = doc.row_of("cnn_mart", _joined([True] * 200, [True] * 199 + [False], "converged"))
    assert above.ladder - above.autoattack == pytest.approx(0.5)
    assert doc.problems_of(above) == ["cnn_mart: converged at 100.00% above AutoAttack's 99.50%"]
    assert doc.problems_of(replace(above, status="not converged")) == []
    misled = doc.row_of("cnn_fast", _joined([True] * 4, [True] * 4, doc.MISLED))
    assert doc.problems_of(misled) == [f"cnn_fast: '{doc.MISLED}' while neither the step probe nor the two-draw "
                                       f"test flags a sample"]
    assert doc.problems_of(replace(misled, step_probe=1)) == [] and doc.problems_of(replace(misled, two_draws=3)) == []


def test_the_table_has_one_line_per_model_with_the_columns_asked_for() -> None:
    r = doc.row_of("cnn_free", _joined([True, False], [True, False], "converged", fwd=20.0, bwd=25.0))
    head, rule, line = doc.table([r])
    assert head.count("|") == rule.count("|") == line.count("|") == 14
    assert line == ("| cnn_free | hand-made | 32/255 | 2 | 50.00 | converged | 50.00 | 0 | 0.50 | 0.20 | 10 | "
                    "0 / 0 | hold |")


def test_trades_loss_is_clean_ce_plus_beta_times_the_kl_to_the_adversarial_output() -> None:
    clean, adv, y = torch.tensor([[0.0, 0.0]]), torch.tensor([[math.log(3.0), 0.0]]), torch.tensor([0])
    kl = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)  # KL([.5, .5] || [.75, .25]) = ln(4/3) / 2
    assert obj.kl_rows(clean, adv).item() == pytest.approx(kl, abs=1e-6)
    assert obj.trades_loss(clean, adv, y, beta=6.0).item() == pytest.approx(math.log(2) + 6 * kl, abs=1e-6)
    assert obj.trades_loss(clean, clean, y, beta=6.0).item() == pytest.approx(math.log(2), abs=1e-6)


def test_mart_weights_the_kl_by_how_unsure_the_clean_output_is_and_boosts_the_ce() -> None:
    clean = torch.zeros(1, 3)  # p = 1/3 each: weight 1 - 1/3
    adv = torch.log(torch.tensor([[0.6, 0.3, 0.1]]))
    y = torch.tensor([0])
    boosted = -math.log(0.6) - math.log(1 - 0.3)  # -log p_y - log(1 - the largest other p)
    kl = sum(math.log((1 / 3) / p) / 3 for p in (0.6, 0.3, 0.1))
    assert obj.mart_loss(clean, adv, y, beta=6.0).item() == pytest.approx(boosted + 6 * (2 / 3) * kl, abs=1e-5)
    sure = torch.tensor([[20.0, 0.0, 0.0]])  # clean p_y ~ 1: the KL term weighs ~ 0
    assert obj.mart_loss(sure, adv, y, beta=6.0).item() == pytest.approx(boosted, abs=1e-5)


def test_the_attack_points_stay_in_the_ball_and_the_box() -> None:
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    x, y, eps = torch.rand(5, 3, 2, 2), torch.tensor([0, 1, 2, 0, 1]), 0.125  # exact in float32
    gen = torch.Generator().manual_seed(0)
    for method, adv in (("trades", HELD_OUT["cnn_trades"].recipe.adversarial),
                        ("fast", HELD_OUT["cnn_fast"].recipe.adversarial)):
        pts = obj.trades_points(net, x, eps, adv, gen) if method == "trades" else obj.fast_points(net, x, y, eps, adv, gen)
        assert float((pts - x).abs().max()) <= eps + 1e-6 and 0 <= float(pts.min()) and float(pts.max()) <= 1
    free = obj.FreeDelta()
    adv = replace(HELD_OUT["cnn_free"].recipe.adversarial, eps=eps, step_size=eps)
    for _ in range(3):  # each replay moves the kept perturbation one sign step of step_size, clipped to eps
        torch.nn.functional.cross_entropy(net(free.point(x)), y).backward()
        free.step(adv, eps)
    assert float(free.delta.abs().max()) == pytest.approx(eps) and set(free.delta.abs().unique().tolist()) <= {0.0, eps}


def test_recipes_record_as_before_and_refuse_mixed_settings() -> None:
    assert set(CNN_AT.as_dict()["adversarial"]) == {"eps", "steps", "step_size", "eps_warmup_epochs"}
    assert HELD_OUT["cnn_mart"].recipe.as_dict()["adversarial"]["method"] == "mart"
    assert doc.MODELS["cnn_trades"].eps == HELD_OUT_EPS == 32 / 255  # held_out_doc.py repeats it (torch-free)
    assert set(doc.TRAINED) == set(HELD_OUT)
    for bad in (dict(method="pgd", beta=6.0), dict(method="trades"), dict(method="free"),
                dict(method="fast", replays=2), dict(method="sgd")):
        with pytest.raises(UserError):
            Adversarial(**bad)


def test_one_short_epoch_of_each_held_out_recipe_trains_the_same_weights_twice() -> None:
    from robustbench_pid.data import load_dataset
    from robustbench_pid.train.loop import fit

    held = _script("held_out")
    train_ds, test_ds = load_dataset("digits", "train", model_info={}), load_dataset("digits", "test", model_info={})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        for name in HELD_OUT:
            states = []
            for _ in range(2):
                torch.manual_seed(HELD_OUT[name].recipe.seed)
                net = held._arch(name)
                fit(net, replace(HELD_OUT[name].recipe, epochs=1, warmup_epochs=1), train_ds, test_ds, name,
                    lambda *_: None, limit=48)
                states.append(net.state_dict())
            assert all(torch.equal(states[0][k], states[1][k]) for k in states[0]), name
            torch.manual_seed(HELD_OUT[name].recipe.seed)
            assert not torch.equal(held._arch(name).head.weight, states[0]["head.weight"]), name  # it did train
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(False)


def test_docs_block_is_the_rendering_of_the_committed_records() -> None:
    fresh, problems = doc.check()
    assert fresh, "docs/held_out.md's block is stale: python scripts/held_out.py --render"
    rs = doc.rows()
    assert len(rs) == len(doc.MODELS) >= 5 and all(r.n >= 200 for r in rs)
    assert problems == [p for r in rs for p in doc.problems_of(r)]
    block = external_doc.block_of(doc.DOC, doc.BEGIN, doc.END)
    for r in rs:
        assert f"| {r.model} | " in block and f"| {r.ladder:.2f} | {r.status} | {r.autoattack:.2f} |" in block
