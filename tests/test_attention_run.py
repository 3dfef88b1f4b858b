"""``--analyze attention`` in a run: the file, its identity, loading, summaries, plots and the report section."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import robustbench_pid as rbp
from robustbench_pid.errors import UserError
from robustbench_pid.results.report.attention import (last_layer, load_attention, paired_attention, summarize_attention,
                                               with_shift_gain)
from robustbench_pid.results.report.attention_report import attention_markdown, verdict
from robustbench_pid.results.files.merge import finalize_run
from robustbench_pid.run.spec_builder import build_spec

RUN = dict(attack="pgd", eps=["4/255", "8/255"], steps=3, limit=8, batch_size=8, quiet=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("attention")
    for model in ("deit", "pid_deit"):
        rbp.evaluate(model=model, analyze="attention", out=root / model, **RUN)
    return root


def test_the_file_is_tidy_and_carries_each_condition_identity(runs):
    df = pd.read_parquet(runs / "deit" / "attention.parquet")
    for col in ("sample_id", "attack", "eps", "layer", "metric", "value", "settings_id", "moved", "note"):
        assert col in df.columns
    recs = pd.read_parquet(runs / "deit" / "records.parquet")
    ids = recs.drop_duplicates("unit").set_index("unit")["settings_id"]
    assert (df["settings_id"] == df["unit"].map(ids)).all()
    assert sorted(df["layer"].unique()) == [0, 1, 2, 3, 4]
    assert set(df["metric"]) == {"shift", "token_similarity", "effective_rank", "attention_entropy"}
    per = df.groupby(["attack", "eps", "layer", "metric"]).size()
    assert (per == 8).all()  # every sample once per (condition, layer, metric)
    assert sorted(df["eps"].unique()) == pytest.approx([0.0, 4 / 255, 8 / 255])
    clean = df[df["attack"] == "clean"]
    assert (clean.loc[clean["metric"] == "shift", "value"] == 0).all() and not clean["moved"].any()
    # a sample counts as moved when the attack ran on it and changed its pixels
    attacked = recs[recs["attack"] == "pgd"].set_index(["eps", "sample_id"])["attacked"]
    adv = df[(df["attack"] == "pgd") & (df["metric"] == "shift") & (df["layer"] == 0)]
    assert (adv["moved"].to_numpy() <= attacked.loc[list(zip(adv["eps"], adv["sample_id"]))].to_numpy()).all()
    assert (adv.loc[adv["moved"], "value"] > 0).all() and (adv.loc[~adv["moved"], "value"] == 0).all()
    assert df["note"].eq("").all() and df["value"].notna().all()


def test_pid_internals_only_in_the_pid_run(runs):
    pid = set(pd.read_parquet(runs / "pid_deit" / "attention.parquet")["metric"])
    soft = set(pd.read_parquet(runs / "deit" / "attention.parquet")["metric"])
    assert {"pid_error_norm", "pid_share_attn", "pid_share_p", "pid_share_i", "pid_share_d"} <= pid
    assert not any(m.startswith("pid_") for m in soft)


def test_analysis_is_part_of_the_run_identity(tmp_path):
    with_ = build_spec("deit", **RUN, analyze="attention")
    without = build_spec("deit", **RUN)
    assert with_.analyze == ["attention"] and "analyze" not in without.as_dict()  # old folder names unchanged
    rbp.evaluate(model="deit", attack="pgd", eps="4/255", steps=3, limit=8, batch_size=8, quiet=True, out=tmp_path / "a")
    rbp.evaluate(model="deit", attack="pgd", eps="4/255", steps=3, limit=8, batch_size=8, quiet=True,
                 out=tmp_path / "b", analyze=["attention"])
    keys = [{u["key"] for u in json.loads((tmp_path / d / "plan.json").read_text())["units"]} for d in "ab"]
    assert keys[0].isdisjoint(keys[1])
    assert not (tmp_path / "a" / "attention.parquet").exists()
    with pytest.raises(UserError, match="--analyze attention"):
        load_attention(tmp_path / "a")
    # a damaged unit file is caught by its checksum when the run is assembled
    side = next((tmp_path / "b" / "units").glob("*.attention.parquet"))
    side.write_bytes(side.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(UserError, match="does not match the sha256"):
        finalize_run(tmp_path / "b")


def test_bad_analyze_options_are_clear_errors():
    with pytest.raises(UserError, match="unknown analysis; valid: attention"):
        build_spec("deit", attack="pgd", analyze="attentoin")
    with pytest.raises(UserError, match="adversarial benchmark"):
        build_spec("deit", benchmark="rank-collapse", analyze="attention")


def test_summary_intervals_and_paired_comparison(runs):
    df = load_attention(runs)
    assert set(df["model"]) == {"deit", "pid_deit"}
    s = summarize_attention(df)
    clean_shift = s[(s["attack"] == "clean") & (s["metric"] == "shift")]
    assert (clean_shift[["value", "ci_low", "ci_high"]].to_numpy() == 0).all() and (clean_shift["n"] == 8).all()
    one = s[(s["model"] == "deit") & (s["attack"] == "pgd") & (s["metric"] == "token_similarity") & (s["layer"] == 2)]
    raw = df[(df["model"] == "deit") & (df["attack"] == "pgd") & (df["metric"] == "token_similarity")
             & (df["layer"] == 2) & df["moved"]]
    r = one[one["eps"] == raw["eps"].max()].iloc[0]
    v = raw.loc[raw["eps"] == raw["eps"].max(), "value"].to_numpy()
    half = 1.959963984540054 * v.std(ddof=1) / np.sqrt(len(v))
    assert r["value"] == pytest.approx(v.mean()) and r["ci_high"] - r["value"] == pytest.approx(half)
    assert sorted(last_layer(s)["layer"].unique()) == [4]
    same = paired_attention(df, "deit", "deit")
    assert (same["delta"] == 0).all() and (same["p_wilcoxon"] == 1).all()
    c = paired_attention(df, "deit", "pid_deit", n_boot=200)
    row = c[(c["attack"] == "pgd") & (c["layer"] == 4)].iloc[0]
    assert row["delta"] == pytest.approx(row["mean_b"] - row["mean_a"])
    assert row["ci_low"] <= row["delta"] <= row["ci_high"] and 0 < row["p_wilcoxon"] <= 1
    lines = verdict(df, n_boot=200)
    assert len(lines) == 8 and all("PID" in ln for ln in lines)  # 2 eps x 4 claims
    gain = with_shift_gain(df)
    g = gain[(gain["metric"] == "shift_gain") & (gain["model"] == "deit")].iloc[0]
    sh = df[(df["metric"] == "shift") & (df["model"] == "deit") & (df["sample_id"] == g["sample_id"])
            & (df["eps"] == g["eps"])].set_index("layer")["value"]
    assert g["layer"] == 4 and g["value"] == pytest.approx(sh[4] / sh[0])
    assert "Last layer" in attention_markdown(df, n_boot=200)


def test_one_command_gives_plots_and_the_report_section(runs, tmp_path):
    cmd = [sys.executable, "-m", "robustbench_pid"]
    subprocess.run(cmd + ["plot", str(runs), "--out", str(tmp_path / "plots"), "--format", "png"], check=True,
                   capture_output=True)
    names = {p.name for p in (tmp_path / "plots").iterdir()}
    assert {"attention_shift.png", "attention_last_shift.png", "attention_pid_error_norm.png"} <= names
    subprocess.run(cmd + ["report", str(runs), "--out", str(tmp_path / "r.html")], check=True, capture_output=True)
    html = (tmp_path / "r.html").read_text()
    assert "Inside the model under attack" in html and "PID damps the perturbation" in html
    assert "id='plot-attention_last_shift'" in html


def test_dry_run_states_the_extra_pass(tmp_path):
    out = subprocess.run([sys.executable, "-m", "robustbench_pid", "evaluate", "--model", "deit", "--attack", "pgd",
                          "--eps", "4/255", "--limit", "8", "--analyze", "attention", "--dry-run", "--out",
                          str(tmp_path / "d"), "--calibration", "100,50"], check=True, capture_output=True, text=True)
    assert "+1 forward pass with hooks per sample and condition" in out.stdout
    clean_line = next(ln for ln in out.stdout.splitlines() if " clean " in ln)
    assert clean_line.split()[6] == "2"  # the clean pass + the probe's pass
    assert not (tmp_path / "d").exists()


def test_sharded_run_gives_the_same_attention_file(runs, tmp_path):
    """Shards split a chunk's clean and attack units between processes: an attack unit without its chunk's
    clean representations recomputes them, and merge assembles the same rows as the single-process run."""
    out = tmp_path / "sharded"
    from robustbench_pid.run.runner import run

    for shard in ("0/2", "1/2"):  # the second shard to finish assembles the folder
        run(build_spec("deit", analyze="attention", out=out, shard=shard, **RUN))
    key = ["attack", "eps", "sample_id", "layer", "metric"]
    a = pd.read_parquet(out / "attention.parquet").sort_values(key).reset_index(drop=True)
    b = pd.read_parquet(runs / "deit" / "attention.parquet").sort_values(key).reset_index(drop=True)
    assert len(a) == len(b)
    np.testing.assert_allclose(a["value"].to_numpy(), b["value"].to_numpy(), rtol=1e-6, atol=1e-9)


def test_a_model_without_blocks_is_refused_before_anything_is_written(tmp_path):
    import torch

    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    data = (torch.rand(4, 3, 32, 32), torch.tensor([0, 1, 2, 3]))
    with pytest.raises(UserError, match="Sequential has none: drop --analyze attention"):
        rbp.evaluate(net, attack="pgd", eps="2/255", data=data, analyze="attention", out=tmp_path / "x", quiet=True)
    assert not (tmp_path / "x" / "plan.json").exists()


def test_runs_of_other_settings_stay_apart_a_run_given_twice_counts_once_and_the_unbounded_check_is_not_probed(
        tmp_path):
    """PGD-2 and PGD-10 of one model at one eps are two rows (they were merged under one label, with one's value);
    a run passed twice does not double n; --indicators' unbounded check run is no condition of the analysis."""
    from robustbench_pid.results.report.attention_report import last_layer_table

    base = dict(attack="pgd", eps="4/255", limit=8, batch_size=8, quiet=True, analyze="attention")
    rbp.evaluate(model="deit", steps=2, out=tmp_path / "a2", **base)
    rbp.evaluate(model="deit", steps=10, out=tmp_path / "a10", **base)
    both = load_attention([tmp_path / "a2", tmp_path / "a10"])
    table = last_layer_table(both).frame
    pgd = table[table["condition"].str.startswith("pgd")]
    assert sorted(pgd["condition"]) == ["pgd 4/255 (a10)", "pgd 4/255 (a2)"]
    own = last_layer_table(load_attention(tmp_path / "a2")).frame
    mine = pgd[pgd["condition"] == "pgd 4/255 (a2)"]["shift"].iloc[0]
    assert mine == own[own["condition"] == "pgd 4/255"]["shift"].iloc[0]
    twice = load_attention([tmp_path / "a2", tmp_path / "a2"])
    assert len(twice) == len(load_attention(tmp_path / "a2"))
    rbp.evaluate(model="deit", steps=2, indicators=True, out=tmp_path / "ai", **base)
    probed = pd.read_parquet(tmp_path / "ai" / "attention.parquet")
    assert sorted(set(probed["eps"])) == [0.0, 4 / 255]  # not the unbounded run's eps 1
