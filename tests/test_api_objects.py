"""``rbp.evaluate`` / ``rbp.attack`` with model and data objects: the same records as the same
weights and samples by name, identity by content (resume yes, mixing no), the caller's model never
touched, and ``rbp.attack`` = a run's unit. On the CPU, explicitly (records are compared exactly)."""
from __future__ import annotations

import copy
import json

import pandas as pd
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import robustbench_pid as rbp
from robustbench_pid.errors import UserError
from robustbench_pid.run.context import unit_seed
from robustbench_pid.specs import Unit

from conftest import model_state

N = 24
RESULT_COLS = ["sample_id", "attack", "eps", "label", "clean_pred", "clean_correct_top1", "clean_correct_top5",
               "pred", "correct_top1", "correct_top5", "attacked", "pert_linf", "pert_l2", "pert_l1"]
PGD = dict(attack="pgd", eps="4/255", steps=3)  # with its random start: the draws matter

pytestmark = pytest.mark.usefixtures("one_thread")


def _records(df: pd.DataFrame) -> pd.DataFrame:
    recs = rbp.load_records(df.attrs["run_dir"])
    return recs[RESULT_COLS].reset_index(drop=True)


@pytest.fixture(scope="module")
def net():
    """The digits PID DeiT as a user holds it: the bare timm network with the embedded weights,
    in train mode with trainable parameters (as after a training loop), mean/std kept apart."""
    m = rbp.load_model("pid_deit")
    n = copy.deepcopy(m.net)
    n.train()
    for p in n.parameters():
        p.requires_grad_(True)
    return n, m.info["mean"], m.info["std"]


@pytest.fixture(scope="module")
def xy(digits_test):
    return digits_test.images[:N].clone(), digits_test.labels[:N].clone()


class Pairs(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


def test_module_gives_the_records_of_the_same_weights_by_name(tmp_path, net):
    n, mean, std = net
    before = model_state(n)
    obj = rbp.evaluate(model=n, mean=mean, std=std, dataset="digits", limit=N, batch_size=8, device="cpu",
                       out=tmp_path / "obj", **PGD)
    assert model_state(n) == before and n.training  # still train mode, trainable, on its device
    named = rbp.evaluate(model="pid_deit", limit=N, batch_size=8, device="cpu", out=tmp_path / "name", **PGD)
    pd.testing.assert_frame_equal(_records(obj), _records(named), check_exact=True)
    info = json.loads((tmp_path / "obj" / "run.json").read_text())
    assert info["model"] == "PidVisionTransformer" and info["checkpoint"].startswith("object:")
    assert len(info["checkpoint_sha256"]) == 64 and info["model_config"]["num_classes"] == 10  # inferred
    assert (_records(obj).attack == "pgd").sum() == N and not _records(obj).correct_top1.all()


def test_resume_by_content_and_two_models_refused(tmp_path, net):
    n, mean, std = net
    out = tmp_path / "run"
    a = rbp.evaluate(model=n, mean=mean, std=std, dataset="digits", attack="fgsm", eps="2/255", limit=8,
                     device="cpu", out=out)
    units = sorted(p.name for p in (out / "units").glob("*.parquet"))
    stamp = {p: (out / "units" / p).stat().st_mtime_ns for p in units}
    # a fresh copy with the same weights: the same model, every unit reused
    b = rbp.evaluate(model=copy.deepcopy(n), mean=mean, std=std, dataset="digits", attack="fgsm", eps="2/255",
                     limit=8, device="cpu",
                     out=out)
    assert {p: (out / "units" / p).stat().st_mtime_ns for p in units} == stamp
    pd.testing.assert_frame_equal(a, b)
    other = copy.deepcopy(n)
    with torch.no_grad():
        next(other.parameters()).add_(1e-3)
    with pytest.raises(UserError, match="holds a run of another model") as exc:
        rbp.evaluate(model=other, mean=mean, std=std, dataset="digits", attack="fgsm", eps="2/255", limit=8,
                     device="cpu", out=out)
    assert "another out" in str(exc.value)
    with pytest.raises(UserError, match="holds a run of another model"):
        rbp.evaluate(model="deit", attack="fgsm", eps="2/255", limit=8, device="cpu", out=out)


def test_dataset_dataloader_and_tensors_give_identical_records(tmp_path, net, xy):
    n, mean, std = net
    x, y = xy
    kw = dict(model=n, mean=mean, std=std, device="cpu", **PGD)
    t = _records(rbp.evaluate(data=(x, y), batch_size=8, out=tmp_path / "t", **kw))
    d = _records(rbp.evaluate(data=Pairs(x, y), batch_size=8, out=tmp_path / "d", **kw))
    # a shuffling loader: its dataset is read in index order, with the loader's batch size
    loader = DataLoader(Pairs(x, y), batch_size=8, shuffle=True)
    df = rbp.evaluate(data=loader, out=tmp_path / "l", **kw)
    pd.testing.assert_frame_equal(t, d, check_exact=True)
    pd.testing.assert_frame_equal(t, _records(df), check_exact=True)
    assert t.sample_id.iloc[:N].tolist() == [str(i) for i in range(N)]
    assert json.loads((tmp_path / "l" / "run.json").read_text())["batch_size"] == 8
    # the same samples by name (digits' ids are load_digits rows, so compare by position)
    named = _records(rbp.evaluate(model="pid_deit", limit=N, batch_size=8, device="cpu", out=tmp_path / "n", **PGD))
    cols = [c for c in RESULT_COLS if c != "sample_id"]
    pd.testing.assert_frame_equal(t[cols], named[cols], check_exact=True)
    # other data under the same name never reuses these records
    x2 = x.clone()
    x2[0] = 1 - x2[0]
    t2 = _records(rbp.evaluate(data=(x2, y), batch_size=8, out=tmp_path / "t2", **kw))
    assert not t2.equals(t)


def test_attack_equals_a_runs_unit(tmp_path, net, xy):
    n, mean, std = net
    x, y = xy
    before = model_state(n)
    df = rbp.evaluate(model=n, mean=mean, std=std, data=(x, y), attack="pgd", eps="4/255", steps=3, seed=5,
                      batch_size=8, device="cpu", out=tmp_path / "r")
    recs = rbp.load_records(df.attrs["run_dir"])
    pgd = recs[recs.attack == "pgd"].reset_index(drop=True)
    xa = rbp.attack(n, x, y, "pgd", eps=4 / 255, steps=3, seed=5, mean=mean, std=std, batch_size=8)
    assert model_state(n) == before
    d = (xa - x).flatten(1)
    assert torch.equal(torch.tensor(pgd.pert_linf.to_numpy(), dtype=torch.float32), d.abs().amax(1))
    assert torch.equal(torch.tensor(pgd.pert_l2.to_numpy(), dtype=torch.float32), d.norm(dim=1))
    m = rbp.load_model("pid_deit")
    with torch.no_grad():
        pred = m(xa).argmax(1)
    assert pred.tolist() == pgd.pred.tolist()
    assert d.abs().max() <= 4 / 255 + 1e-6 and (d.abs().amax(1) > 0).sum() == pgd.attacked.sum()
    # the seed is the run's --seed: another one draws other random starts
    assert not torch.equal(xa, rbp.attack(n, x, y, "pgd", eps=4 / 255, steps=3, seed=6, mean=mean, std=std,
                                           batch_size=8))
    # the unit seed does not involve the model: a name gives the same images as the object
    assert torch.equal(xa, rbp.attack("pid_deit", x, y, "pgd", eps=4 / 255, steps=3, seed=5, batch_size=8))
    plan = json.loads((tmp_path / "r" / "plan.json").read_text())
    u = next(u for u in plan["units"] if u["attack"] == "pgd")
    assert unit_seed(Unit("adversarial", "pgd", u["eps"], u["params"], "", 0, N), 5) == \
        unit_seed(Unit(u["benchmark"], u["attack"], u["eps"], u["params"], u["condition"], u["start"], u["stop"]), 5)


def test_paper_protocol_attack_and_callers_model_untouched(net, xy):
    n, mean, std = net
    x, y = xy
    before = model_state(n)
    compiled = torch.compile(n, backend="eager")
    z = rbp.attack(compiled, x[:8], y[:8], "fgsm", eps=3 / 255, protocol="paper", mean=mean, std=std)
    assert model_state(n) == before and compiled._orig_mod is n
    # paper: eps in normalised units, so a pixel change of eps * std, unclipped
    assert (z - x[:8]).abs().amax().item() == pytest.approx(3 / 255 * std[0], abs=1e-6)


def test_bad_objects_are_clear_errors(net, xy):
    n, mean, std = net
    x, y = xy
    with pytest.raises(UserError, match="both mean= and std="):
        rbp.evaluate(model=n, mean=mean, data=(x, y), attack="fgsm")
    with pytest.raises(UserError, match=r"in \[0, 1\]"):
        rbp.evaluate(model=n, data=(x * 255, y), attack="fgsm")
    with pytest.raises(UserError, match="Dataset of \\(image, label\\)"):
        rbp.evaluate(model=n, data=[1, 2, 3], attack="fgsm")
    with pytest.raises(UserError, match="torch.nn.Module"):
        rbp.evaluate(model=42, attack="fgsm")
    with pytest.raises(UserError, match="labels up to 10"):
        rbp.evaluate(model=n, mean=mean, std=std, data=(x, y + 1), attack="fgsm", device="cpu")
    # options of the registered datasets are refused for data objects, not ignored
    with pytest.raises(UserError, match="'digits' is a registered dataset; with data= it only names"):
        rbp.evaluate(model=n, mean=mean, std=std, data=(x, y), dataset="digits", attack="fgsm")
    for kw in ({"subset": 4}, {"skip_unreadable": True}, {"imagenet_root": "/x"}, {"data_root": "/x"}):
        with pytest.raises(UserError, match=f"{next(iter(kw))}: options of the registered datasets"):
            rbp.evaluate(model=n, mean=mean, std=std, data=(x, y), attack="fgsm", **kw)


CHEAP = {"fgsm": {}, "pgd": {"steps": 1}, "pgd_l2": {"steps": 1, "eps": 0.5}, "sld": {"iterations": 1},
         "cw": {"steps": 1, "search_steps": 1}, "spsa": {"iterations": 1, "n_samples": 2},
         "square": {"n_queries": 2}, "noise": {}, "autoattack": {}, "apgd_ce": {"steps": 2},
         "apgd_t": {"steps": 2, "targets": 1}, "apgd_ranked": {"steps": 2, "targets": 1, "pool": 2},
         "fab_t": {"steps": 2, "targets": 1},
         "apgd_eot": {"steps": 2, "eot_iter": 2}, "apgd_strong": {"steps": 2, "restarts": 1}}
# the L2 forms (register_l2): the same cheap settings as their L-inf classes
CHEAP.update({f"{k}_l2": v for k, v in CHEAP.items() if k in ("square", "autoattack", "apgd_ce", "apgd_t",
                                                               "apgd_ranked", "fab_t", "apgd_eot")})


@pytest.mark.parametrize("name", sorted(CHEAP))
def test_no_attack_changes_the_model_it_is_given(name, digits_batch):
    """Every registered attack, called directly on a model in an unusual state (train mode, some
    parameters trainable), leaves that state as it was: device, modes, requires_grad."""
    from robustbench_pid.attacks import attacks, make_attack

    assert set(CHEAP) == set(attacks.names()), "a new attack: add cheap settings for it here"
    m = rbp.load_model("deit")
    m.train()
    for i, p in enumerate(m.parameters()):
        p.requires_grad_(i % 2 == 0)
    before = model_state(m)
    x, y = digits_batch
    make_attack(name, **CHEAP[name])(m, x[:2], y[:2], generator=torch.Generator().manual_seed(0))
    assert model_state(m) == before


def test_a_timm_network_given_without_its_normalisation_is_warned_about():
    """A timm network's config names the normalisation it was trained with; wrapping it without mean=/std=
    feeds it unnormalised pixels, so that is said (and nothing is said once mean=/std= are given)."""
    import warnings

    import timm

    from robustbench_pid.run.objects import wrap_model

    net = timm.create_model("deit_digits_patch4_32", num_classes=10)
    with pytest.warns(UserWarning, match=r"timm config names mean=\[.*no mean=/std= was given"):
        wrap_model(net, None, None, "raw", None)
    cfg = net.pretrained_cfg
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrapped = wrap_model(net, list(cfg["mean"]), list(cfg["std"]), "normalised", None)
    assert wrapped.info["mean"] == [float(v) for v in cfg["mean"]]


def test_a_samples_random_start_does_not_depend_on_which_other_samples_are_attacked(tmp_path, net, xy):
    """The standard protocol attacks only the clean-top-5-correct samples; their random starts are drawn for the
    whole batch and taken at the attacked rows, so a sample's start (and so its result) is the same whether or
    not a neighbour is attacked: common random numbers hold for two models whose clean top-5 sets differ."""
    n, mean, std = net
    x, y = xy
    x, y = x[:8], y[:8].clone()
    kw = dict(model=n, mean=mean, std=std, device="cpu", attack="pgd", eps="8/255", steps=1, batch_size=8)
    base = _records(rbp.evaluate(data=(x, y), out=tmp_path / "a", **kw))
    with torch.no_grad():
        logits = rbp.load_model("pid_deit")(x[:1])  # the same weights, as a [0, 1]-pixel model
    y2 = y.clone()
    y2[0] = int(logits.argmin())  # the least likely class: sample 0 is not clean-top-5 correct, so not attacked
    other = _records(rbp.evaluate(data=(x, y2), out=tmp_path / "b", **kw))
    adv = lambda r: r[r["attack"] == "pgd"].reset_index(drop=True)  # noqa: E731
    a, b = adv(base), adv(other)
    assert bool(a["attacked"].iloc[0]) and not bool(b["attacked"].iloc[0])
    pd.testing.assert_series_equal(a["pert_l2"].iloc[1:], b["pert_l2"].iloc[1:], check_exact=True)
