"""Inputs checked where they enter, from a review of the CLI, the Python API and the run machinery: values that
were accepted and then silently changed, dropped or turned into another number (each refused with a message
naming the fix), and the run folder's name not depending on where or how fast a run computes."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import robustbench_pid as rbp
from robustbench_pid.cli import main
from robustbench_pid.errors import UserError
from robustbench_pid.results.files.run_files import default_out
from robustbench_pid.run.spec_builder import build_spec


def _digits(n: int = 4):
    ds = rbp.load_dataset("digits", split="test")
    return torch.stack([ds[i][0] for i in range(n)]), torch.tensor([int(ds[i][1]) for i in range(n)])


def test_the_default_run_folder_does_not_depend_on_device_or_compile():
    """A killed run re-run on another device (one GPU per shard) or with --compile resumes its folder."""
    base = dict(attack="pgd", eps="4/255", limit=8)
    names = {default_out(build_spec("deit", device=d, compile=c, **base)) for d in ("auto", "cpu", "cuda:1")
             for c in (False, True)}
    assert len(names) == 1
    assert default_out(build_spec("deit", seed=1, **base)) not in names  # what it computes still names it


def test_api_attack_checks_seed_batch_size_and_eps_where_they_enter():
    net = rbp.load_model("deit")
    x, y = _digits()
    ok = rbp.attack(net, x, y, "fgsm", eps=np.float32(2 / 255), seed=1)
    assert torch.equal(ok, rbp.attack(net, x, y, "fgsm", eps=torch.tensor(2 / 255), seed=1))
    for kw, says in ((dict(seed=1.7), "seed must be a whole number"), (dict(seed=True), "seed must be a whole"),
                     (dict(seed=-1), "seed must be >= 0"), (dict(batch_size=-2), "batch_size must be >= 1"),
                     (dict(batch_size=0), "batch_size must be >= 1"), (dict(batch_size=2.5), "batch_size must be a whole"),
                     (dict(batch_size=True), "batch_size must be a whole"),
                     (dict(eps=1.0), "spans the whole pixel range"), (dict(eps=[1 / 255, 2 / 255]), "one value")):
        args = {"eps": 2 / 255, **kw}
        with pytest.raises(UserError, match=says):
            rbp.attack(net, x, y, "fgsm", **args)


@pytest.mark.parametrize("mean,std,says", [([0.5] * 3, [float("nan"), 1, 1], "std > 0"),
                                           ([float("inf"), 0, 0], [1, 1, 1], "finite number per channel"),
                                           ("0.5", [1, 1, 1], "finite number per channel")])
def test_a_non_finite_or_text_normalisation_is_refused_where_it_enters(mean, std, says):
    from robustbench_pid.run.objects import wrap_model

    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 10))
    with pytest.raises(UserError, match=says):
        wrap_model(net, mean, std)


def test_numpy_and_torch_scalars_are_eps_values_and_an_empty_out_is_refused():
    s = build_spec("deit", attack="fgsm", eps=np.float32(0.25))
    assert [a.params["eps"] for a in s.attacks] == [0.25]
    assert [a.params["eps"] for a in build_spec("deit", attack="fgsm", eps=torch.tensor([1 / 255])).attacks] == \
        [pytest.approx(1 / 255)]
    with pytest.raises(UserError, match="not true/false"):
        build_spec("deit", attack="fgsm", eps=True)
    with pytest.raises(UserError, match="--out is empty"):
        build_spec("deit", attack="fgsm", eps="4/255", out="")


def test_reproduce_converge_dry_run_checks_and_prices_the_converged_runs(tmp_path, capsys):
    args = ["reproduce", "digits-smoke", "--model", "pid_deit", "--converge", "--dry-run", "--calibration", "100,50",
            "--limit", "4", "--out", str(tmp_path / "s")]
    assert main(args + ["--converge-tol", "0.5"]) == 2
    assert "--converge-tol must be a share in [0, 0.05]" in capsys.readouterr().err
    assert main(args + ["--converge-opt", "foo=1"]) == 2
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "pgd-4+conv" in out and "fgsm-2+conv" in out and "Nothing was computed or written" in out
    assert not (tmp_path / "s").exists()


def test_table_refuses_an_eps_choice_for_an_attack_not_in_the_results(tmp_path):
    rows = pd.DataFrame([dict(run_id="r", model="m", dataset="digits", protocol="standard", benchmark="adversarial",
                              attack=a, eps=e, metric="top1", value=50.0, n=10, norm=n)
                         for a, e, n in (("clean", 0.0, ""), ("pgd", 4 / 255, "linf"))])
    with pytest.raises(UserError, match="--eps pgdd=...: no such attack in the results; present: pgd"):
        rbp.table(rows, layout="paper", eps={"pgdd": "4/255"})


@pytest.mark.parametrize("argv, says", [
    (["evaluate", "--model", "deit", "--attack", "pgd", "--eps", "4/255", "--converge", "--converge-opt", "steps=1",
      "--converge-opt", "steps=2"], "--converge-opt steps is given twice ('steps=1' and 'steps=2'); give each key once"),
    (["evaluate", "--model", "deit", "--attack", "pgd", "--param", "steps=3", "--param", "steps = 4"],
     "--param steps is given twice ('steps=3' and 'steps = 4')"),
    (["evaluate", "--model", "deit", "--model-arg", "depth=2", "--model-arg", "depth=3"], "--model-arg depth is given twice"),
    (["evaluate", "--model", "deit", "--model-arg", "=2"], "the KEY before '=' is empty"),
    (["reproduce", "digits-smoke", "--model", "deit", "--converge", "--converge-opt", "step-size=1",
      "--converge-opt", "step_size=2"], "--converge-opt step_size is given twice"),
    (["reproduce", "digits-smoke", "--model", "deit", "--dataset-root", "imagenet=/a", "--dataset-root",
      "imagenet=/b"], "--dataset-root imagenet is given twice ('/a' and '/b')"),
    (["reproduce", "claims-digits", "--all-columns", "--checkpoint", "deit=a.pth", "--checkpoint", "deit=b.pth"],
     "--checkpoint deit=... is given twice ('a.pth' and 'b.pth')"),
])
def test_a_key_given_twice_is_refused_not_the_last_kept(tmp_path, capsys, argv, says):
    """Every KEY=VALUE option kept the last value of a repeated key silently (issue 45)."""
    assert main([*argv, "--limit", "4", "--quiet", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "out").exists()


def test_api_params_given_twice_are_refused(tmp_path):
    kw = dict(attack="pgd", eps="4/255", limit=4, out=tmp_path / "o")
    with pytest.raises(UserError, match=r"param steps is given twice \('steps=2' and 'steps=3'\)"):
        rbp.evaluate("deit", param=["steps=2", "steps=3"], **kw)
    with pytest.raises(UserError, match="attack setting 'steps' is given in both params= and param="):
        rbp.evaluate("deit", params={"steps": 2}, param=["steps=3"], **kw)
    assert not (tmp_path / "o").exists()


def test_table_eps_choice_given_twice_is_refused(tmp_path):
    from robustbench_pid.results.tables.layouts import _parse_eps_choice

    assert _parse_eps_choice("pgd=4/255, fgsm=2/255") == pytest.approx({"pgd": 4 / 255, "fgsm": 2 / 255})
    with pytest.raises(UserError, match="pgd is given twice"):
        _parse_eps_choice("pgd=4/255,pgd=2/255")
    with pytest.raises(UserError, match="the eps for every attack is given twice"):
        _parse_eps_choice("4/255,2/255")


def test_a_settings_mapping_naming_one_key_twice_is_refused():
    from robustbench_pid.run.spec_builder import key_values

    assert key_values({"step-size": 1}, "--param") == {"step_size": 1}
    with pytest.raises(UserError, match="--param: keys 'step-size', 'step_size' name one setting twice"):
        key_values({"step-size": 1, "step_size": 2}, "--param")


@pytest.mark.parametrize("name", ["../../escape", "/tmp/escape_abs_api", "..", ".", "a\nb"])
def test_a_model_name_or_dataset_name_that_is_a_path_stays_in_the_results_folder(tmp_path, monkeypatch, name):
    """name= and dataset= label a model object and its data; in the default run folder's name they are one folder
    name under results/ (separators and leading dots replaced), never a path elsewhere; the label stays as given."""
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    x, y = torch.rand(4, 3, 4, 4), torch.tensor([0, 1, 2, 0])
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 3))
    df = rbp.evaluate(model=net, data=(x, y), name=name, dataset=name, device="cpu")
    run = Path(df.attrs["run_dir"])
    assert run.parent == tmp_path / "results" and not run.name.startswith(".")
    assert set(df["model"]) == {name}
    assert not Path("/tmp/escape_abs_api").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["results"]
