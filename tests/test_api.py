"""The notebook API: rbp.evaluate builds the same spec as the `evaluate` command and returns tidy results."""
from __future__ import annotations

import argparse

import pandas as pd
import pytest

import robustbench_pid as rbp
from robustbench_pid.cli import evaluate as cmd
from robustbench_pid.cli import evaluate_main
from robustbench_pid.errors import UserError
from robustbench_pid.run.spec_builder import build_spec, option_defaults


def _parser():
    p = argparse.ArgumentParser()
    cmd.add_arguments(p)
    return p


def _cli_spec(argv):
    return build_spec(**cmd.spec_options(_parser().parse_args(argv)))


def test_same_spec_as_the_command():
    """rbp.evaluate's keywords and the command's flags go through one builder to one spec."""
    api = build_spec("pid_deit", attack=["pgd"], eps=["1/255", "3/255"], limit=10, steps=5,
                     param={"random_start": False}, quiet=False)
    cli = _cli_spec(["--model", "pid_deit", "--attack", "pgd", "--eps", "1/255,3/255", "--limit", "10",
                     "--steps", "5", "--param", "random_start=False"])
    assert api.as_dict() == cli.as_dict()
    assert [a.params["eps"] for a in api.attacks] == pytest.approx([1 / 255, 3 / 255])
    assert api.attacks[0].params["random_start"] is False and api.attacks[0].params["steps"] == 5


def test_builder_defaults_are_the_commands_defaults():
    """The parser only parses: every default the command has, the library builder has too."""
    flags = vars(_parser().parse_args(["--model", "m"]))
    assert set(option_defaults()) <= set(flags)
    for k, v in option_defaults().items():
        # None in the builder: "not given", which the parser says as None or an empty repeatable flag
        assert flags[k] in (None, []) if v is None else flags[k] == v, k
    assert option_defaults()["batch_size"] == 128 and option_defaults()["device"] == "auto"


def test_evaluate_returns_the_tidy_results_of_the_run(tmp_path):
    df = rbp.evaluate(model="deit", attack="fgsm", eps=2 / 255, limit=20, batch_size=20, out=tmp_path / "api")
    assert list(df.columns[:18]) == ["run_id", "model", "checkpoint_sha256", "dataset", "protocol", "benchmark",
                                     "attack", "eps", "setting", "metric", "value", "n", "ci_low", "ci_high",
                                     "settings_id", "samples_id", "precision", "settings"]
    assert set(df.loc[df["attack"] == "fgsm", "setting"]) == {"FGSM"}
    evidence = {("fgsm", m) for m in ("passes_forward", "passes_backward", "silent_success", "unavailable_gradients")}
    assert set(zip(df["attack"], df["metric"])) == {("clean", "top1"), ("clean", "top5"), ("fgsm", "top1"),
                                                    ("fgsm", "top5")} | evidence  # + docs/attacks.md's evidence
    assert (df["n"] == 20).all() and df.attrs["run_dir"] == str(tmp_path / "api")
    # the command with the same options writes the same numbers
    assert evaluate_main(["--model", "deit", "--attack", "fgsm", "--eps", "2/255", "--limit", "20", "--batch-size",
                          "20", "--out", str(tmp_path / "cli"), "--quiet"]) == 0
    cli = pd.read_csv(tmp_path / "cli" / "summary.csv")
    cols = ["attack", "metric", "value", "ci_low", "ci_high"]
    pd.testing.assert_frame_equal(df[cols].reset_index(drop=True), cli[cols], check_dtype=False)
    # the tidy frame carries its run folder, so tables get per-sample records (paired tests) from it
    t = rbp.table(df)
    assert t.frame.iloc[0]["deit"].startswith(f"{df.loc[0, 'value']:.2f} [")


def test_bad_options_are_clear_errors():
    with pytest.raises(UserError, match="unknown option 'stepz'"):
        rbp.evaluate(model="deit", attack="pgd", stepz=3)
    with pytest.raises(UserError, match="eps"):
        rbp.evaluate(model="deit", attack="pgd", eps="three")
    with pytest.raises(UserError, match="dry"):
        rbp.evaluate(model="deit", attack="pgd", dry_run=True)
