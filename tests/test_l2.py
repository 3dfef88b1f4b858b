"""The L2 threat model end to end (issue 55 item 3): AutoAttack L2 is pyautoattack's L2 AutoAttack sample by sample,
``--converge`` runs the ladder's L2 rungs under the same stop rule and ends at or below AutoAttack per sample,
``--suite robustbench-l2`` plans RobustBench's CIFAR-10 L2 0.5 leaderboard, and ``export --robustbench`` writes an
L2 entry whose images re-score to its robust accuracy. On the embedded digits DeiT at L2 eps 0.3 and 0.4 (pixel
units of images in [0, 1]: the first 12 test digits keep 6 and 1 robust under AutoAttack L2)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import robustbench_pid as rbp
from robustbench_pid.attacks import make_attack
from robustbench_pid.attacks.base import still_correct
from robustbench_pid.attacks.square import seed_from

EPS = (0.3, 0.4)
N = 12


@pytest.fixture(scope="module")
def digits():
    ds = rbp.load_dataset("digits", split="test")
    return ds.images[:N], ds.labels[:N]


@pytest.fixture(scope="module")
def aa_run(tmp_path_factory):
    """AutoAttack L2 at both eps, adversarial images kept."""
    out = tmp_path_factory.mktemp("l2aa") / "run"
    rbp.evaluate(model="deit", attack="autoattack_l2", eps=list(EPS), limit=N, save_adv=True, out=out, quiet=True,
                 device="cpu")
    return out


@pytest.fixture(scope="module")
def conv_run(tmp_path_factory):
    """PGD-L2-20 with the ladder at both eps (a separate run: AutoAttack in rung 0 would hand the ladder its own
    result)."""
    out = tmp_path_factory.mktemp("l2conv") / "run"
    rbp.evaluate(model="deit", attack="pgd_l2", eps=list(EPS), limit=N, converge=True, out=out, quiet=True,
                 device="cpu")
    return out


def test_autoattack_l2_is_pyautoattacks_l2_autoattack_sample_by_sample(deit_model, digits):
    """The wrapper adds seeding, pass counting and the final projection; the verdicts are the library's, with the
    seed the wrapper draws from the run's generator."""
    from pyautoattack import AutoAttack

    x, y = digits
    for eps in EPS:
        ours = make_attack("autoattack_l2", eps=eps)(deit_model, x, y, bounds=(0.0, 1.0),
                                                     generator=torch.Generator().manual_seed(0))
        seed = seed_from(torch.Generator().manual_seed(0))
        with torch.random.fork_rng():
            direct = AutoAttack(deit_model, norm="L2", eps=eps, version="standard", seed=seed,
                                device="cpu").run_standard_evaluation(x, y, batch_size=len(x))[0]
        with torch.no_grad():
            a, b = deit_model(ours).argmax(1) == y, deit_model(direct).argmax(1) == y
        assert a.tolist() == b.tolist(), eps
        assert float((ours - x).flatten(1).norm(dim=1).max()) <= eps + 1e-5  # inside the L2 ball
        assert 0 < int(a.sum()) < N or eps == EPS[1]  # the lower eps leaves some robust, some broken


def test_l2_converge_runs_the_l2_rungs_and_ends_at_or_below_autoattack_per_sample(conv_run, aa_run):
    rec, aa_rec = rbp.load_records(conv_run), rbp.load_records(aa_run)
    for eps in EPS:
        conv = rec[((rec["eps"] - eps).abs() < 1e-9) & (rec["attack"] == "converge")].set_index("sample_id")
        aa = aa_rec[((aa_rec["eps"] - eps).abs() < 1e-9) & (aa_rec["attack"] == "autoattack_l2")].set_index("sample_id")
        assert set(conv["norm"]) == {"l2"} and len(conv) == N and len(aa) == N
        labels = str(conv["converge_labels"].iloc[0]).split(",")
        assert labels[0] == "pgd_l2" and {"apgd_ranked_l2", "apgd_ce_l2", "square_l2"} <= set(labels)
        later = [r for r in str(conv["converge_rungs"].iloc[0]).split(",") if "@" in r]
        assert ("fab_t_l2" in labels) == any(r.startswith("fab-t@") for r in later)  # FAB-T: the full budget only
        assert not any(x in ("spsa", "apgd_ranked", "apgd_ce", "fab_t", "square") for x in labels)
        status = str(conv["converge_status"].iloc[0])
        tol = int(conv["converge_tolerance"].iloc[0])
        above = [s for s in conv.index if bool(conv.loc[s, "correct_top1"]) and not bool(aa.loc[s, "correct_top1"])]
        if status == "converged":
            assert len(above) <= tol, (eps, above)
        assert conv["correct_top1"].astype(bool).sum() <= aa["correct_top1"].astype(bool).sum() + tol
        # every point the ladder returned is inside the L2 ball
        assert float(conv["pert_l2"].max()) <= eps + 1e-5


def test_l2_export_writes_an_l2_entry_whose_images_rescore_to_its_robust_accuracy(aa_run, tmp_path, deit_model):
    out = tmp_path / "rb"
    r = subprocess.run([sys.executable, "-m", "robustbench_pid", "export", str(aa_run), "--robustbench", str(out),
                        "--model-id", "Test2026L2", "--eps", "0.3"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    entry = json.loads((out / "model_info" / "digits" / "L2" / "Test2026L2.json").read_text())
    assert entry["eps"] == "0.3" and "L2 0.3" in entry["footnote"]
    x = torch.load(out / "external_evaluation" / "Test2026L2.pt", weights_only=True)
    rec = rbp.load_records(aa_run)
    aa = rec[(rec["attack"] == "autoattack_l2") & ((rec["eps"] - 0.3).abs() < 1e-9)]
    y = torch.tensor(aa["label"].to_numpy())
    with torch.inference_mode():
        ok = still_correct(deit_model(x), y, 1)
    assert "external" not in entry  # no ladder ran in this run
    assert f"{100 * float(ok.float().mean()):.2f}" == entry["autoattack_acc"]
    assert f"{100 * aa['correct_top1'].astype(bool).mean():.2f}" == entry["autoattack_acc"]
    clean = rbp.load_dataset("digits", split="test").images[:N]
    assert float((x - clean).flatten(1).norm(dim=1).max()) <= 0.3 + 1e-4


def test_the_robustbench_l2_suite_is_cifar10_autoattack_l2_at_05_and_names_what_it_lacks():
    from robustbench_pid.core import robustbench as rb
    from robustbench_pid.run.suites import leaderboard_options, load_suite

    board = rb.leaderboard("cifar10", "L2")
    assert board["eps"] == "0.5" and board["threat_model"] == "L2" and board["n"] == 10000
    suite = load_suite("robustbench-l2", "cifar10")
    assert [(a.attack, a.params["eps"]) for a in suite["attacks"]] == [("autoattack_l2", 0.5)]
    assert leaderboard_options("robustbench-l2", "cifar10", None, "standard") == {}
    r = subprocess.run([sys.executable, "-m", "robustbench_pid", "evaluate", "--model", "timm:resnet18", "--dataset",
                        "cifar100", "--suite", "robustbench-l2", "--dry-run"], capture_output=True, text=True)
    assert r.returncode != 0 and "no L2 leaderboard" in r.stderr and "cifar10 L2 0.5" in r.stderr
    assert r.stderr.count("error:") == 1
    # a RobustBench entry runs under its own threat model's leaderboard only
    from robustbench_pid.errors import UserError

    with pytest.raises(UserError, match="L2 entry and --suite robustbench its Linf leaderboard: use --suite "
                                        "robustbench-l2"):
        leaderboard_options("robustbench", "cifar10", None, "standard", "robustbench:L2/Standard")
    assert leaderboard_options("robustbench-l2", "cifar10", None, "standard", "robustbench:L2/Standard") == {}
