"""robustbench-pid export RUN --robustbench DIR: the model_info JSON read back against RobustBench's field list (kept
as data with its source commit), the adversarial tensor re-scored to the recorded verdicts, the corruption CSV in
RobustBench's layout; every bad input one error line and nothing written."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import torch

import robustbench_pid as rbp
from robustbench_pid.attacks.base import still_correct
from robustbench_pid.core import robustbench as rb
from robustbench_pid.errors import UserError

FAST = {"steps": 25, "sweep_steps": 6, "square_queries": 100, "square_budget": 200, "eot_iter": 4, "spsa_iterations": 5,
        "spsa_samples": 16}
TYPES = {"str": lambda v: isinstance(v, str), "bool": lambda v: isinstance(v, bool),
         "int": lambda v: isinstance(v, int) and not isinstance(v, bool), "null": lambda v: v is None,
         "empty": lambda v: v == "",
         "accuracy": lambda v: isinstance(v, str) and len(v.split(".")[-1]) == 2 and 0 <= float(v) <= 100}


@pytest.fixture(scope="module")
def aa_run(tmp_path_factory):
    """AutoAttack at 16/255 (quick: every digit breaks in its first attack) plus the ladder, images kept."""
    out = tmp_path_factory.mktemp("aa") / "run"
    rbp.evaluate(model="pid_deit", attack="autoattack", eps="16/255", limit=8, converge=True, converge_opt=FAST,
                 save_adv=True, out=out, quiet=True)
    return out


def _cli(*argv):
    r = subprocess.run([sys.executable, "-m", "robustbench_pid", "export", *map(str, argv)], capture_output=True,
                       text=True)
    return r.returncode, r.stdout, r.stderr


def _fits_field_list(entry, threat):
    """RobustBench's field list (names, required per threat model, JSON types), read from the shipped data."""
    fields = rb.facts()["model_info"]["fields"]
    assert set(entry) <= set(fields), set(entry) - set(fields)
    assert {k for k, f in fields.items() if threat in f["required"]} <= set(entry)
    for k, v in entry.items():
        assert any(TYPES[t](v) for t in fields[k]["type"].split("|")), (k, v)


def test_entry_fields_types_numbers_and_tensor(aa_run, tmp_path, pid_model):
    out = tmp_path / "rb"
    code, stdout, stderr = _cli(aa_run, "--robustbench", out, "--name", "PIDformer", "--authors", "A, B",
                                "--venue", "ICML 2024", "--link", "https://example.org/paper", "--reported", "12.5",
                                "--model-id", "Nguyen2024PIDformer")
    assert code == 0, stderr
    path = out / "model_info" / "digits" / "Linf" / "Nguyen2024PIDformer.json"
    entry = json.loads(path.read_text())
    _fits_field_list(entry, "Linf")
    assert list(entry)[:5] == ["link", "name", "authors", "additional_data", "number_forward_passes"]
    summary = rbp.load_results(aa_run)
    top1 = summary[summary["metric"] == "top1"].set_index("attack")["value"]
    assert entry["clean_acc"] == f"{top1['clean']:.2f}" and entry["autoattack_acc"] == f"{top1['autoattack']:.2f}"
    # the ladder found no more than AutoAttack (every digit breaks at 16/255): no external evaluation, said so
    assert top1["converge"] == top1["autoattack"] and "external" not in entry and entry["eps"] == "16/255"
    assert entry["reported"] == "12.50" and entry["name"] == "PIDformer" and entry["dataset"] == "digits"
    assert "--converge ladder" in entry["footnote"] and "not RobustBench-comparable" in entry["footnote"]
    assert "found no more than AutoAttack" in entry["footnote"]
    assert entry["unreliable"] is True  # a reduced ladder is not the full one: said, and flagged
    # only the fields nobody gave are named, on one warning line
    assert stderr.count("warning:") == 1 and "additional_data (false)" in stderr and "authors" not in stderr
    # the tensor: the test set's size and order, [0, 1], re-scored to the recorded (AutoAttack's) verdicts
    x = torch.load(out / "external_evaluation" / "Nguyen2024PIDformer.pt", weights_only=True)
    rec = rbp.load_records(aa_run)
    conv = rec[rec["attack"] == "autoattack"]
    assert x.shape == (8, 3, 32, 32) and x.dtype == torch.float32 and 0 <= float(x.min()) and float(x.max()) <= 1
    y = torch.tensor(conv["label"].to_numpy())
    with torch.inference_mode():
        ok = still_correct(pid_model(x), y, 1)
    assert ok.tolist() == conv["correct_top1"].astype(bool).tolist()
    assert f"{100 * float(ok.float().mean()):.2f}" == entry["autoattack_acc"]
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["robustbench_comparable"] is False and rb.facts()["source"]["commit"] in manifest["robustbench_facts"]
    issue = (out / "external_evaluation" / "Nguyen2024PIDformer.md").read_text()
    assert "+ **Robust accuracy:** " + entry["autoattack_acc"] + "%" in issue


def test_external_is_the_converged_value_only_where_it_is_below_autoattack(aa_run):
    """RobustBench fills ``external`` from an evaluation that found less than AutoAttack: the ladder's value goes
    there (with its images) only when it is lower at the entry's two decimals."""
    from robustbench_pid.export.model_info import Given, linf_entry
    from robustbench_pid.results.store import load_runs, summarize

    runs = load_runs(aa_run)
    records, info = runs.records, {**json.loads((aa_run / "run.json").read_text()), "path": str(aa_run)}
    summary = summarize(records)
    same = linf_entry(records, summary, info, Given())
    assert "external" not in same.info and same.condition["attack"] == "autoattack"
    lower = summary.copy()
    aa_value = float(lower.loc[(lower["attack"] == "autoattack") & (lower["metric"] == "top1"), "value"].iloc[0])
    lower.loc[(lower["attack"] == "autoattack") & (lower["metric"] == "top1"), "value"] = aa_value + 12.5
    below = linf_entry(records, lower, info, Given())
    assert below.info["external"] == f"{aa_value:.2f}" and below.condition["attack"] == "converge"
    assert below.info["autoattack_acc"] == f"{aa_value + 12.5:.2f}" and "below AutoAttack's" in below.info["footnote"]


def test_python_api_warns_once_and_checks_its_inputs(aa_run, tmp_path):
    with pytest.warns(UserWarning, match="fields the run cannot know") as got:
        done = rbp.export_robustbench(aa_run, tmp_path / "api", additional_data=True, forward_passes=2)
    assert len(got) == 1 and "additional_data" not in str(got[0].message)
    assert done.entry["additional_data"] is True and done.entry["number_forward_passes"] == 2
    for kw, needle in ((dict(forward_passes=0), "--forward-passes must be a whole number >= 1"),
                       (dict(reported="high"), "--reported 'high' must be the paper's robust accuracy"),
                       (dict(model_id="../x"), "it is a path"), (dict(additional_data="yes"), "must be True or False"),
                       (dict(eps=True), "eps must be a number")):
        with pytest.raises(UserError, match=needle):
            rbp.export_robustbench(aa_run, tmp_path / "bad", **kw)
    assert not (tmp_path / "bad").exists()


def _copy(run, tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(run, dst)
    return dst


def test_every_bad_input_is_one_error_line_and_writes_nothing(aa_run, tmp_path):
    # a run without --save-adv (its run.json keeps no image list)
    plain = _copy(aa_run, tmp_path, "plain")
    info = json.loads((plain / "run.json").read_text())
    (plain / "run.json").write_text(json.dumps({k: v for k, v in info.items() if k != "adversarial_sha256"}))
    # an incomplete run
    running = _copy(aa_run, tmp_path, "running")
    (running / "run.json").write_text(json.dumps({**info, "status": "running"}))
    # a damaged image file
    damaged = _copy(aa_run, tmp_path, "damaged")
    victim = damaged / next(iter(info["adversarial_sha256"]))
    victim.write_bytes(victim.read_bytes()[:-3] + b"xyz")
    # run.json pointing outside the run
    outside = _copy(aa_run, tmp_path, "outside")
    (outside / "run.json").write_text(json.dumps({**info, "adversarial_sha256": {
        **info["adversarial_sha256"], "../../elsewhere.safetensors": "0" * 64}}))
    cases = [((outside,), "lists '../../elsewhere.safetensors' among its adversarial images, which is no file of the "
                          "run's adversarial/ folder"),
             ((plain,), "was run without --save-adv, so it keeps no adversarial images; re-run its evaluate command "
                        "with --save-adv"),
             ((running,), "run is not complete (status 'running'); re-run its evaluate command"),
             ((damaged,), "does not match the sha256 recorded in run.json"),
             ((tmp_path / "nowhere",), "does not exist: give a run folder"),
             ((aa_run / "records.parquet",), "is a file: give a run folder")]
    for (run,), needle in cases:
        dest = tmp_path / f"out-{run.name}"
        code, stdout, stderr = _cli(run, "--robustbench", dest)
        assert code == 2 and stderr.startswith("error: ") and stderr.strip().count("\n") == 0, stderr
        assert needle in stderr, stderr
        assert not (dest / "model_info").exists() and not (dest / "external_evaluation").exists()
    code, _, stderr = _cli(aa_run, "--robustbench", aa_run / "rb")
    assert code == 2 and "is inside the run folder" in stderr and not (aa_run / "rb").exists()
    code, _, stderr = _cli(aa_run)
    assert code == 2 and stderr.startswith("error: export needs a format: --robustbench DIR")


def test_a_run_without_autoattack_is_refused(tmp_path):
    run = tmp_path / "fgsm"
    rbp.evaluate(model="pid_deit", attack="fgsm", eps="4/255", limit=4, save_adv=True, out=run, quiet=True)
    with pytest.raises(UserError, match="no AutoAttack condition.*--attack autoattack"):
        rbp.export_robustbench(run, tmp_path / "rb")


def test_corruption_run_writes_the_unaggregated_csv(tmp_path):
    run = tmp_path / "corr"
    rbp.evaluate(model="pid_deit", benchmark="corruptions", bench_opt={"corruptions": ["contrast", "fog"],
                                                                        "severities": [1, 5]},
                 limit=8, out=run, quiet=True)
    with pytest.warns(UserWarning):
        rbp.export_robustbench(run, tmp_path / "rb", model_id="Mine2025Test")
    folder = tmp_path / "rb" / "model_info" / "digits" / "corruptions"
    entry = json.loads((folder / "Mine2025Test.json").read_text())
    _fits_field_list(entry, "corruptions")
    table = pd.read_csv(folder / "unaggregated_results.csv", header=[0, 1], index_col=0)
    assert list(table.index) == ["Mine2025Test"]
    assert [(c, int(s)) for c, s in table.columns] == [("fog", 1), ("fog", 5), ("contrast", 1), ("contrast", 5)]
    rec = rbp.load_records(run)
    for c, s in table.columns:
        got = rec[(rec["corruption"] == c) & (rec["severity"] == int(s))]["correct_top1"].mean()
        assert table.loc["Mine2025Test", (c, s)] == pytest.approx(got)
    assert entry["corruptions_acc"] == f"{100 * table.to_numpy().mean():.2f}" and entry["eps"] is None
    assert "corruptions_mce" not in entry  # no AlexNet baseline outside ImageNet
